//! The experiment's runs on disk: a finished run of the same settings is reused, an unfinished
//! one started again, and with a record folder what reuse reads is kept there and restored from
//! it (so an experiment longer than one session resumes on another machine).

use super::*;

pub(super) fn settings_of(cfg: &TrainConfig) -> TrainConfig {
    TrainConfig { env: crate::rl::train::EnvUrls(Vec::new()), out_dir: PathBuf::new(), ..cfg.clone() }
}

/// Run `cfg`, or read the run back when its folder holds a finished run of the same settings.
/// A finished run of other settings is an error (nothing is overwritten); an unfinished one is
/// started again.
/// Every step done, and the last evaluation written when the run evaluates.
pub(super) fn finished(cfg: &TrainConfig, run: &RunDir, metrics: &[StepMetrics]) -> bool {
    metrics.len() as u64 == cfg.steps
        && (cfg.eval_data.is_none() || cfg.eval_every == 0 || run.eval_path(cfg.steps).exists())
}

/// A finished run of `cfg` in its folder (restored from the record if missing), or `None`.
pub(super) fn finished_run(cfg: &TrainConfig, record: Record<'_>) -> Result<Option<RunSummary>> {
    let run = RunDir::new(&cfg.out_dir);
    if !run.config_path().exists() {
        record.restore_run(&cfg.out_dir)?;
    }
    if !run.config_path().exists() {
        return Ok(None);
    }
    let metrics = run.metrics()?;
    if !finished(cfg, &run, &metrics) || settings_of(&TrainConfig::from_file(&run.config_path())?) != settings_of(cfg) {
        return Ok(None);
    }
    Ok(Some(RunSummary { metrics, evals: run.evals()?, out_dir: cfg.out_dir.clone() }))
}

pub(super) fn run_or_reuse(cfg: &TrainConfig, label: &str, record: Record<'_>, progress: bool) -> Result<RunSummary> {
    let run = RunDir::new(&cfg.out_dir);
    if !run.config_path().exists() {
        record.restore_run(&cfg.out_dir)?;
    }
    if run.config_path().exists() {
        let existing = TrainConfig::from_file(&run.config_path())?;
        let metrics = run.metrics()?;
        if finished(cfg, &run, &metrics) {
            if settings_of(&existing) != settings_of(cfg) {
                bail!(
                    "{} holds a finished run with other settings than this experiment's; move it away or choose \
                     another output folder",
                    cfg.out_dir.display()
                );
            }
            if progress {
                eprintln!("{label}: reusing the finished run in {}", cfg.out_dir.display());
            }
            record.keep_run(&cfg.out_dir)?;
            return Ok(RunSummary { metrics, evals: run.evals()?, out_dir: cfg.out_dir.clone() });
        }
        if progress {
            eprintln!("{label}: {} holds an unfinished run; starting it again", cfg.out_dir.display());
        }
        std::fs::remove_dir_all(&cfg.out_dir).with_context(|| format!("remove {}", cfg.out_dir.display()))?;
    }
    let opts = RunOptions { resume: false, progress, label: label.to_string() };
    let summary = crate::rl::train::run(cfg, &opts).with_context(|| label.to_string())?;
    record.keep_run(&cfg.out_dir)?;
    Ok(summary)
}

/// The experiment's `record` folder (see [`ExperimentConfig::record`]): paths under `out` map to
/// the same relative paths under `root`. Without a root every method does nothing.
#[derive(Debug, Clone, Copy)]
pub(super) struct Record<'a> {
    pub(super) out: &'a Path,
    pub(super) root: Option<&'a Path>,
}

impl Record<'_> {
    fn mirror(&self, path: &Path) -> Result<Option<PathBuf>> {
        let Some(root) = self.root else { return Ok(None) };
        let rel = path
            .strip_prefix(self.out)
            .with_context(|| format!("{} is not under the output folder {}", path.display(), self.out.display()))?;
        Ok(Some(root.join(rel)))
    }

    /// Copy the recorded file over `path` when `path` is missing.
    pub(super) fn restore(&self, path: &Path) -> Result<()> {
        match self.mirror(path)? {
            Some(kept) if kept.exists() && !path.exists() => copy_file(&kept, path),
            _ => Ok(()),
        }
    }

    /// Copy `path` into the record (replacing what was there).
    pub(super) fn keep(&self, path: &Path) -> Result<()> {
        match self.mirror(path)? {
            Some(kept) => copy_file(path, &kept),
            None => Ok(()),
        }
    }

    /// Fill a missing run folder from the record, when the record holds that run.
    fn restore_run(&self, dir: &Path) -> Result<()> {
        let Some(kept) = self.mirror(dir)? else { return Ok(()) };
        if !RunDir::new(&kept).config_path().exists() {
            return Ok(());
        }
        for file in RunDir::new(&kept).summary_files()? {
            let name = file.file_name().context("a recorded file has no name")?;
            copy_file(&file, &dir.join(name))?;
        }
        Ok(())
    }

    /// Copy a finished run's configuration, metrics and evaluations into the record.
    fn keep_run(&self, dir: &Path) -> Result<()> {
        let Some(kept) = self.mirror(dir)? else { return Ok(()) };
        // What a finished run of other settings left there must not mix with this one's files.
        if kept.exists() {
            std::fs::remove_dir_all(&kept).with_context(|| format!("remove {}", kept.display()))?;
        }
        for file in RunDir::new(dir).summary_files()? {
            let name = file.file_name().context("a run file has no name")?;
            copy_file(&file, &kept.join(name))?;
        }
        Ok(())
    }
}

pub(super) fn copy_file(from: &Path, to: &Path) -> Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The starting checkpoint on the held-out questions, evaluated once and kept in `path`.
pub(super) fn evaluate_start(train: &TrainConfig, path: &Path, progress: bool) -> Result<EvalPoint> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let point: EvalPoint = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
        return Ok(point);
    }
    let placement = crate::engine::device::place_with(train.device, train.precision)?;
    let (_vs, model) = load_model(&train.model, placement.device, placement.kind)?;
    let tok = Tokenizer::from_dir(train.tokenizer.as_deref().unwrap_or(&train.model))?;
    let (tasks, selection) = held_out(train)?;
    let envs = connect_all(&train.env.0)?;
    let agent = train.agent(train.prompt_template_text()?);
    let point = eval_point(&model, &tok, &envs, (&tasks, selection), &agent, train.eval_sampled, 0, train.seed)?;
    if progress {
        eprint!("{}", format_eval_point(&point, &agent));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&point)?)?;
    Ok(point)
}

pub(super) fn slug(label: &str) -> String {
    let s: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_keeps_what_reuse_reads_and_restores_it_into_an_empty_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let (out, kept) = (tmp.path().join("out"), tmp.path().join("record"));
        let run = out.join("strong").join("chain-n-4").join("seed-0");
        std::fs::create_dir_all(run.join("checkpoint-40")).unwrap();
        for (name, text) in [
            ("config.toml", "steps = 40\n"),
            ("metrics.jsonl", "{}\n"),
            ("eval-10.json", "{\"a\":1}"),
            ("eval-40.json", "{\"a\":2}"),
            ("rollouts-3.jsonl", "big"),
            ("checkpoint-40/model.safetensors", "weights"),
        ] {
            std::fs::write(run.join(name), text).unwrap();
        }
        std::fs::write(out.join("strong").join("start.json"), "{}").unwrap();
        let record = Record { out: &out, root: Some(&kept) };
        // A stale file of an earlier run in the record goes.
        std::fs::create_dir_all(kept.join("strong/chain-n-4/seed-0")).unwrap();
        std::fs::write(kept.join("strong/chain-n-4/seed-0/eval-20.json"), "old").unwrap();
        record.keep_run(&run).unwrap();
        record.keep(&out.join("strong").join("start.json")).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(kept.join("strong/chain-n-4/seed-0"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["config.toml", "eval-10.json", "eval-40.json", "metrics.jsonl"]);

        // Another machine: an empty output folder is filled from the record.
        std::fs::remove_dir_all(&out).unwrap();
        record.restore(&out.join("strong").join("start.json")).unwrap();
        record.restore_run(&run).unwrap();
        assert_eq!(std::fs::read_to_string(run.join("eval-40.json")).unwrap(), "{\"a\":2}");
        assert_eq!(std::fs::read_to_string(run.join("config.toml")).unwrap(), "steps = 40\n");
        assert!(out.join("strong").join("start.json").exists());
        assert!(!run.join("checkpoint-40").exists());
        // A run the record does not hold is left to be trained.
        let other = out.join("strong").join("tree").join("seed-0");
        record.restore_run(&other).unwrap();
        assert!(!other.exists());
        // A path outside the output folder is an error, not a silent miss.
        assert!(record.keep(&tmp.path().join("elsewhere.json")).is_err());
        // Without a record nothing happens.
        Record { out: &out, root: None }.keep_run(&run).unwrap();
    }

    #[test]
    fn the_record_folder_is_read_from_the_toml_and_not_written_back() {
        let cfg: ExperimentConfig = toml::from_str("record = \"kept\"\nseeds = [0]\n").unwrap();
        assert_eq!(cfg.record.as_deref(), Some(Path::new("kept")));
        assert!(!toml::to_string_pretty(&cfg).unwrap().contains("kept"));
        assert!(toml::from_str::<ExperimentConfig>("recrod = \"kept\"\n").is_err());
    }
}
