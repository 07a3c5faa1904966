//! Sessions: what survives a dropped WebSocket. A session owns episodes (the sim knows it as
//! their owner) and the replies owed to its client; a connection is attached to at most one
//! session at a time. When a connection drops, its session waits `reattach_grace_secs` for a new
//! connection that presents the session's token in `Hello::resume`; then it replays the replies
//! the client lists as pending, once, and routes later ones to the new connection. Past the
//! grace period the session's episodes are closed.
//!
//! Which replies can be lost in a drop: those written to the old socket but never read, those
//! still queued for it, and those produced while no connection was attached. Every one of them
//! answers a request the client still lists as pending, so a session keeps (a) the encoded
//! replies its writers handed to the socket, newest first, within `replay_buffer_bytes`
//! ([`Ring`]), (b) the replies produced while detached, and (c) which requests are still being
//! worked on and on which connection they arrived. A pending id in none of these was never
//! received: the client sends it again. All rings together stay within `max_replay_bytes_total`
//! (a ring over it pushes out its own oldest replies; each keeps its newest).
//!
//! Only the sim thread touches [`Sessions`]; connection writers reach their session's [`Ring`]
//! through the cell the sim thread fills at the handshake.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use grove_protocol::{Envelope, ErrorCode, ErrorInfo, RequestId, Response, Resumed, Session, Welcome};
use hyper::body::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use super::{Outgoing, Payload};
use crate::metrics::Metrics;
use crate::sim::{ConnId, Sim};

/// A session's id; the sim sees it as the owner of the session's episodes.
pub(crate) type SessionId = u64;

/// What every session's [`Ring`] holds together, and the server-wide bound on it.
#[derive(Debug)]
pub(crate) struct ReplayBudget {
    metrics: Arc<Metrics>,
    max_total: usize,
}

impl ReplayBudget {
    pub(crate) fn new(metrics: Arc<Metrics>, max_total: usize) -> Arc<ReplayBudget> {
        Arc::new(ReplayBudget { metrics, max_total })
    }

    fn add(&self, n: usize) {
        self.metrics.replay_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.metrics.replay_bytes.fetch_sub(n as u64, Ordering::Relaxed);
    }

    fn over(&self) -> bool {
        self.metrics.replay_bytes.load(Ordering::Relaxed) as usize > self.max_total
    }
}

/// The encoded replies a session's writers handed to their sockets, newest last.
#[derive(Debug)]
pub(crate) struct Ring {
    entries: VecDeque<(RequestId, Bytes)>,
    bytes: usize,
    max_bytes: usize,
    budget: Arc<ReplayBudget>,
    /// Ids pushed out of `entries` (bounded): their requests were answered, so a client that
    /// still waits for one gets `reply_lost`, never a second execution.
    evicted: VecDeque<RequestId>,
    max_evicted: usize,
}

impl Ring {
    pub(crate) fn new(max_bytes: usize, max_evicted: usize, budget: Arc<ReplayBudget>) -> Ring {
        Ring { entries: VecDeque::new(), bytes: 0, max_bytes, budget, evicted: VecDeque::new(), max_evicted }
    }

    pub(crate) fn push(&mut self, id: RequestId, bytes: Bytes) {
        self.bytes += bytes.len();
        self.budget.add(bytes.len());
        self.entries.push_back((id, bytes));
        // The newest entry stays whatever its size.
        while (self.bytes > self.max_bytes || self.budget.over()) && self.entries.len() > 1 {
            let Some((old, b)) = self.entries.pop_front() else { break };
            if self.bytes <= self.max_bytes {
                self.budget.metrics.replay_pushed_out_for_memory.fetch_add(1, Ordering::Relaxed);
            }
            self.bytes -= b.len();
            self.budget.sub(b.len());
            self.evicted.push_back(old);
            if self.evicted.len() > self.max_evicted {
                self.evicted.pop_front();
            }
        }
    }

    fn get(&self, id: RequestId) -> Option<Bytes> {
        self.entries.iter().rev().find(|(i, _)| *i == id).map(|(_, b)| b.clone())
    }

    fn was_evicted(&self, id: RequestId) -> bool {
        self.evicted.contains(&id)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.budget.sub(self.bytes);
    }
}

/// Where a connection's writer finds its session's ring once the handshake has set it.
pub(crate) type RingCell = Arc<OnceLock<Arc<Mutex<Ring>>>>;

/// What the sim thread holds for one connection.
struct Conn {
    /// `None` once the connection is closing: replies for its session are held instead.
    tx: Option<mpsc::Sender<Outgoing>>,
    kill: Arc<watch::Sender<bool>>,
    ring: RingCell,
    session: Option<SessionId>,
}

/// A reattach waiting for the old connection of its session to finish closing.
struct WaitingResume {
    conn: ConnId,
    id: RequestId,
    pending: Vec<RequestId>,
    done: oneshot::Sender<bool>,
}

struct SessionState {
    token: String,
    conn: Option<ConnId>,
    detached_at: Option<Instant>,
    ring: Arc<Mutex<Ring>>,
    /// Requests the sim is still working on, and the connection each arrived on (its reply
    /// gives that connection's in-flight permit back only if it goes out on the same one).
    in_flight: HashMap<RequestId, ConnId>,
    /// Replies produced while no connection could take them.
    held: Vec<Envelope<Response>>,
    waiting: Option<WaitingResume>,
}

/// Every connection and session; owned by the sim thread.
pub(crate) struct Sessions {
    conns: HashMap<ConnId, Conn>,
    sessions: HashMap<SessionId, SessionState>,
    by_token: HashMap<String, SessionId>,
    next: SessionId,
    grace: Duration,
    ring_bytes: usize,
    budget: Arc<ReplayBudget>,
    max_pending: usize,
    welcome: Welcome,
    /// Detached sessions in the order they detached (the grace is the same for all, so this is
    /// deadline order); an entry whose session reattached since is skipped when it comes due.
    detached: VecDeque<(Instant, SessionId)>,
}

impl Sessions {
    pub(crate) fn new(
        welcome: Welcome,
        grace: Duration,
        ring_bytes: usize,
        budget: Arc<ReplayBudget>,
        max_pending: usize,
    ) -> Sessions {
        Sessions {
            conns: HashMap::new(),
            sessions: HashMap::new(),
            by_token: HashMap::new(),
            next: 0,
            grace,
            ring_bytes,
            budget,
            max_pending,
            welcome,
            detached: VecDeque::new(),
        }
    }

    pub(crate) fn open(
        &mut self,
        conn: ConnId,
        tx: mpsc::Sender<Outgoing>,
        kill: Arc<watch::Sender<bool>>,
        ring: RingCell,
    ) {
        self.conns.insert(conn, Conn { tx: Some(tx), kill, ring, session: None });
    }

    /// Send on a connection's channel without waiting; gives the reply back when the
    /// connection is closing.
    fn send(&self, conn: ConnId, out: Outgoing) -> Option<Outgoing> {
        let Some(tx) = self.conns.get(&conn).and_then(|c| c.tx.as_ref()) else { return Some(out) };
        match tx.try_send(out) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(o) | mpsc::error::TrySendError::Closed(o)) => Some(o),
        }
    }

    fn send_local(&self, conn: ConnId, envelope: Envelope<Response>) {
        let _ = self.send(conn, Outgoing { payload: Payload::Reply(envelope), counted: false });
    }

    fn refuse(&self, conn: ConnId, id: RequestId, code: ErrorCode, message: String, done: oneshot::Sender<bool>) {
        self.send_local(conn, Envelope::new(id, Response::Error(ErrorInfo::new(code, message))));
        let _ = done.send(false);
    }

    fn session_info(&self, token: &str) -> Session {
        Session { token: token.to_owned(), grace_ms: self.grace.as_millis() as u64 }
    }

    /// A `Hello` whose version is right: open a new session, or reattach to an old one.
    pub(crate) fn hello(
        &mut self,
        conn: ConnId,
        id: RequestId,
        resume: Option<grove_protocol::Resume>,
        done: oneshot::Sender<bool>,
        metrics: &Metrics,
    ) {
        let Some(resume) = resume else {
            self.next += 1;
            let sid = self.next;
            let token = new_token();
            let ring = Arc::new(Mutex::new(Ring::new(self.ring_bytes, self.max_pending * 4, self.budget.clone())));
            let state = SessionState {
                token: token.clone(),
                conn: Some(conn),
                detached_at: None,
                ring: ring.clone(),
                in_flight: HashMap::new(),
                held: Vec::new(),
                waiting: None,
            };
            self.sessions.insert(sid, state);
            self.by_token.insert(token.clone(), sid);
            let welcome = Welcome { session: Some(self.session_info(&token)), resumed: None, ..self.welcome.clone() };
            if let Some(c) = self.conns.get_mut(&conn) {
                c.session = Some(sid);
                let _ = c.ring.set(ring);
            }
            self.send_local(conn, Envelope::new(id, Response::Welcome(welcome)));
            let _ = done.send(true);
            return;
        };
        if resume.pending.len() > self.max_pending {
            let why =
                format!("{} pending ids; at most {} requests can be in flight", resume.pending.len(), self.max_pending);
            return self.refuse(conn, id, ErrorCode::MalformedFrame, why, done);
        }
        let Some(&sid) = self.by_token.get(&resume.token).filter(|_| !self.grace.is_zero()) else {
            let why = "no session with this token: it expired (its episodes are closed) or never existed".to_owned();
            return self.refuse(conn, id, ErrorCode::SessionExpired, why, done);
        };
        let Some(state) = self.sessions.get_mut(&sid) else {
            return self.refuse(conn, id, ErrorCode::Internal, "session without state".into(), done);
        };
        let waiting = WaitingResume { conn, id, pending: resume.pending, done };
        match state.conn {
            // The old connection has not noticed its drop yet: end it, and finish the reattach
            // once its writer has stopped (so that no reply it still held is missed).
            Some(old) if old != conn && self.conns.contains_key(&old) => {
                if let Some(prev) = state.waiting.replace(waiting) {
                    let why = "another connection reattached to this session".to_owned();
                    self.refuse(prev.conn, prev.id, ErrorCode::SessionExpired, why, prev.done);
                }
                if let Some(c) = self.conns.get(&old) {
                    c.kill.send_replace(true);
                }
            }
            _ => self.complete_resume(sid, waiting, metrics),
        }
    }

    fn complete_resume(&mut self, sid: SessionId, w: WaitingResume, metrics: &Metrics) {
        let grace_ms = self.grace.as_millis() as u64;
        let Some(state) = self.sessions.get_mut(&sid) else { return };
        if !self.conns.contains_key(&w.conn) {
            // The new connection went away while it waited.
            return;
        }
        if state.detached_at.take().is_some() {
            metrics.sessions_detached.fetch_sub(1, Ordering::Relaxed);
        }
        state.conn = Some(w.conn);
        let ring = state.ring.clone();
        let held = std::mem::take(&mut state.held);
        let mut replays: Vec<Payload> = Vec::new();
        let mut lost = Vec::new();
        let mut resend = Vec::new();
        {
            let ring = ring.lock().unwrap_or_else(|p| p.into_inner());
            let wanted: HashSet<RequestId> = w.pending.iter().copied().collect();
            let mut from_held: HashMap<RequestId, Envelope<Response>> =
                held.into_iter().filter(|e| wanted.contains(&e.id)).map(|e| (e.id, e)).collect();
            for &id in &w.pending {
                if let Some(env) = from_held.remove(&id) {
                    replays.push(Payload::Reply(env));
                } else if let Some(bytes) = ring.get(id) {
                    replays.push(Payload::Replay(bytes));
                } else if state.in_flight.contains_key(&id) {
                    // Still being worked on: its reply goes to the new connection.
                } else if ring.was_evicted(id) {
                    lost.push(id);
                } else {
                    resend.push(id);
                }
            }
        }
        let resumed = Resumed { replayed: replays.len() as u32, resend };
        let welcome = Welcome {
            session: Some(Session { token: state.token.clone(), grace_ms }),
            resumed: Some(resumed),
            ..self.welcome.clone()
        };
        if let Some(c) = self.conns.get_mut(&w.conn) {
            c.session = Some(sid);
            let _ = c.ring.set(ring);
        }
        self.send_local(w.conn, Envelope::new(w.id, Response::Welcome(welcome)));
        for payload in replays {
            let _ = self.send(w.conn, Outgoing { payload, counted: false });
        }
        for id in lost {
            let why = "the reply was produced but is no longer held (replay_buffer_bytes); the work was done";
            self.send_local(w.conn, Envelope::new(id, Response::Error(ErrorInfo::new(ErrorCode::ReplyLost, why))));
        }
        metrics.reattaches.fetch_add(1, Ordering::Relaxed);
        let _ = w.done.send(true);
    }

    /// A request from a handshaken connection: the sim sees its session as the owner.
    pub(crate) fn request(&mut self, conn: ConnId, id: RequestId) -> Option<SessionId> {
        let sid = self.conns.get(&conn)?.session?;
        self.sessions.get_mut(&sid)?.in_flight.insert(id, conn);
        Some(sid)
    }

    /// A reply of the sim, addressed to a session.
    pub(crate) fn route(&mut self, sid: SessionId, envelope: Envelope<Response>) {
        let Some(state) = self.sessions.get_mut(&sid) else { return };
        let origin = state.in_flight.remove(&envelope.id);
        let Some(conn) = state.conn else {
            state.held.push(envelope);
            return;
        };
        let counted = origin == Some(conn);
        if let Some(out) = self.send(conn, Outgoing { payload: Payload::Reply(envelope), counted })
            && let (Some(state), Payload::Reply(env)) = (self.sessions.get_mut(&sid), out.payload)
        {
            state.held.push(env);
        }
    }

    /// The connection is closing: from now on its session's replies are held.
    pub(crate) fn detach(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.tx = None;
        }
    }

    /// The connection has closed and its writer has stopped. After a goodbye (a normal Close)
    /// the session ends at once: its episodes are closed and its token forgotten.
    pub(crate) fn closed(&mut self, conn: ConnId, goodbye: bool, sim: &mut Sim, metrics: &Metrics) {
        let Some(c) = self.conns.remove(&conn) else { return };
        let Some(sid) = c.session else { return };
        let Some(state) = self.sessions.get_mut(&sid) else { return };
        if state.conn != Some(conn) {
            return;
        }
        state.conn = None;
        if let Some(w) = state.waiting.take() {
            return self.complete_resume(sid, w, metrics);
        }
        if self.grace.is_zero() || goodbye {
            self.end(sid, sim);
        } else {
            let now = Instant::now();
            state.detached_at = Some(now);
            self.detached.push_back((now, sid));
            metrics.sessions_detached.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Close the episodes of sessions whose grace period has run out: only the due ones are
    /// looked at, oldest detach first.
    pub(crate) fn expire(&mut self, now: Instant, sim: &mut Sim, metrics: &Metrics) {
        while let Some(&(at, sid)) = self.detached.front() {
            if now.duration_since(at) < self.grace {
                break;
            }
            self.detached.pop_front();
            // Still detached since that moment (not reattached, and not detached again later).
            if self.sessions.get(&sid).is_none_or(|s| s.detached_at != Some(at)) {
                continue;
            }
            self.end(sid, sim);
            metrics.sessions_detached.fetch_sub(1, Ordering::Relaxed);
            metrics.sessions_expired.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn end(&mut self, sid: SessionId, sim: &mut Sim) {
        if let Some(state) = self.sessions.remove(&sid) {
            self.by_token.remove(&state.token);
        }
        sim.disconnect(sid);
    }
}

/// 128 random bits from the operating system's generator, as hex.
fn new_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_replies_within_its_bytes_and_remembers_what_it_dropped() {
        let budget = ReplayBudget::new(Arc::new(Metrics::default()), usize::MAX);
        let mut ring = Ring::new(10, 2, budget);
        ring.push(1, Bytes::from_static(b"aaaa"));
        ring.push(2, Bytes::from_static(b"bbbb"));
        ring.push(3, Bytes::from_static(b"cccc"));
        assert!(ring.get(1).is_none() && ring.was_evicted(1));
        assert_eq!(ring.get(3).as_deref(), Some(&b"cccc"[..]));
        // One reply larger than the whole buffer is still kept.
        ring.push(4, Bytes::from(vec![0u8; 100]));
        assert!(ring.get(4).is_some() && ring.get(3).is_none());
        assert!(ring.was_evicted(3) && ring.was_evicted(2) && !ring.was_evicted(1), "the record of drops is bounded");
    }

    #[test]
    fn rings_together_stay_within_the_servers_replay_bytes_and_give_them_back_when_dropped() {
        let metrics = Arc::new(Metrics::default());
        let budget = ReplayBudget::new(metrics.clone(), 10);
        let mut a = Ring::new(100, 8, budget.clone());
        let mut b = Ring::new(100, 8, budget);
        a.push(1, Bytes::from_static(b"aaaa"));
        a.push(2, Bytes::from_static(b"aaaa"));
        assert_eq!(metrics.replay_bytes.load(Ordering::Relaxed), 8);
        // b's push takes the total to 12: b pushes out what it can (nothing but its newest)...
        b.push(3, Bytes::from_static(b"bbbb"));
        assert!(b.get(3).is_some());
        // ...and a's next push (14 in all) brings the total back within 10 by pushing out a's
        // oldest reply, though a alone is far within its own 100.
        a.push(4, Bytes::from_static(b"aa"));
        assert!(a.get(1).is_none() && a.was_evicted(1) && a.get(2).is_some() && a.get(4).is_some());
        assert_eq!(metrics.replay_bytes.load(Ordering::Relaxed), 10);
        assert_eq!(metrics.replay_pushed_out_for_memory.load(Ordering::Relaxed), 1);
        drop(a);
        assert_eq!(metrics.replay_bytes.load(Ordering::Relaxed), 4);
        drop(b);
        assert_eq!(metrics.replay_bytes.load(Ordering::Relaxed), 0);
    }
}
