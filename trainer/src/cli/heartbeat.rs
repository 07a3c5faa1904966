//! A sign of life for long commands whose output is not a terminal (a log file, CI, a job
//! scheduler): progress bars hide themselves there, so a 30-minute command would print nothing.
//! Off a terminal, a line when the command starts and one at least every `period` while it runs;
//! on a terminal, nothing (the bars speak).

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the running line is printed by default.
pub const PERIOD: Duration = Duration::from_secs(30);

/// Prints until dropped.
pub struct Heartbeat {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// On stderr, when it is not a terminal.
    pub fn start(label: &str) -> Heartbeat {
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Heartbeat { stop: Arc::new((Mutex::new(false), Condvar::new())), thread: None };
        }
        Heartbeat::to(label, PERIOD, std::io::stderr())
    }

    /// To `out`, every `period`.
    pub fn to(label: &str, period: Duration, mut out: impl Write + Send + 'static) -> Heartbeat {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let (label, flag) = (label.to_string(), stop.clone());
        let started = Instant::now();
        let _ = writeln!(out, "{label}: started");
        let thread = std::thread::spawn(move || {
            let (lock, cvar) = &*flag;
            let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                let (guard, wait) = cvar.wait_timeout(stopped, period).unwrap_or_else(|p| p.into_inner());
                stopped = guard;
                if *stopped {
                    return;
                }
                if wait.timed_out() {
                    let _ = writeln!(out, "{label}: running, {:.0} s", started.elapsed().as_secs_f64());
                }
            }
        });
        Heartbeat { stop, thread: Some(thread) }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let (lock, cvar) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cvar.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_at_start_and_one_per_period_until_dropped() {
        let out = Shared::default();
        let beat = Heartbeat::to("trainer eval", Duration::from_millis(100), out.clone());
        std::thread::sleep(Duration::from_millis(350));
        drop(beat);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "trainer eval: started");
        assert!((3..=4).contains(&(lines.len() - 1)), "{text}");
        assert!(lines[1..].iter().all(|l| l.starts_with("trainer eval: running, ")), "{text}");
        let after = text.len();
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(out.0.lock().unwrap().len(), after, "nothing after the drop");
    }
}
