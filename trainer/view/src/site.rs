//! What the page shows, read from the folder on every request through grove-rundir, so that a
//! run still training is seen as it grows: the routes, the JSON API and the aggregation of an
//! experiment's seeds (mean and 95% t interval per arm and step).
//!
//! The folder is a **run** (a grove-rundir run folder) or an **experiment** (what `trainer
//! experiment` writes: `experiment.toml`, `results.json` and run folders
//! `<regime>/<arm>/seed-<n>/`, or any folder of run folders). Runs are named on the API by a
//! number the server hands out, and steps by their number: no request names a path.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use grove_rundir::stats::t_975;
use grove_rundir::{EvalPoint, PromptTrees, RunDir, StepMetrics};
use serde_json::{Value, json};

use crate::assets;
use crate::http::{JSON, Request, Response};

/// How deep below an experiment folder run folders are looked for (`<regime>/sweep/<lr>/<arm>/
/// seed-<n>` is five).
const MAX_DEPTH: usize = 6;
/// Trees files kept parsed in memory.
const TREES_CACHE: usize = 16;

/// The training curves an experiment's arms are compared on (fields of [`StepMetrics`]).
pub const SERIES: [&str; 6] = ["reward_mean", "metric_mean", "kl", "entropy", "clip_fraction", "tool_calls"];

fn series_value(m: &StepMetrics, name: &str) -> Option<f64> {
    Some(match name {
        "reward_mean" => m.reward_mean,
        "metric_mean" => m.metric_mean,
        "kl" => m.kl,
        "entropy" => m.entropy,
        "clip_fraction" => m.clip_fraction,
        "tool_calls" => m.tool_calls as f64,
        _ => return None,
    })
}

/// What the served folder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Run,
    Experiment,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Experiment => "experiment",
        }
    }
}

/// An API answer other than 200.
#[derive(Debug)]
struct ApiError {
    status: u16,
    message: String,
}

fn api_err(status: u16, message: impl Into<String>) -> ApiError {
    ApiError { status, message: message.into() }
}

type TreesEntry = (Option<SystemTime>, u64, Arc<Vec<u8>>);
/// One seed's run of an arm: its number, its seed folder's name, its folder.
type SeedRun = (usize, String, RunDir);

/// The served folder and what the server remembers of it.
#[derive(Debug)]
pub struct Site {
    root: PathBuf,
    /// Run folders by id, relative to the root (`""`: the root itself). Append-only, so an id
    /// keeps naming the same run while new runs appear.
    runs: Mutex<Vec<PathBuf>>,
    /// The last metrics read without error per run (a line being appended reads as a bad line).
    metrics: Mutex<HashMap<usize, Vec<StepMetrics>>>,
    trees: Mutex<HashMap<(usize, u64), TreesEntry>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `dir` holds a run's files.
fn is_run(dir: &Path) -> bool {
    let run = RunDir::new(dir);
    run.metrics_path().is_file() || run.config_path().is_file() || run.tree_steps().is_ok_and(|s| !s.is_empty())
}

fn find_runs(root: &Path, rel: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else { return };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name())
        .filter(|n| {
            let n = n.to_string_lossy();
            !n.starts_with('.') && !n.starts_with("checkpoint-")
        })
        .map(|n| rel.join(n))
        .collect();
    dirs.sort();
    for d in dirs {
        if is_run(&root.join(&d)) {
            out.push(d);
        } else if depth + 1 < MAX_DEPTH {
            find_runs(root, &d, depth + 1, out);
        }
    }
}

impl Site {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            runs: Mutex::new(Vec::new()),
            metrics: Mutex::new(HashMap::new()),
            trees: Mutex::new(HashMap::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A run folder, or a folder of them (an experiment); decided afresh on each request, so a
    /// run that has not written anything yet becomes an experiment once run folders appear in it.
    pub fn kind(&self) -> Kind {
        if self.root.join("experiment.toml").is_file() || self.root.join("results.json").is_file() {
            return Kind::Experiment;
        }
        if is_run(&self.root) {
            return Kind::Run;
        }
        let mut found = Vec::new();
        find_runs(&self.root, Path::new(""), 0, &mut found);
        if found.is_empty() { Kind::Run } else { Kind::Experiment }
    }

    /// The runs of the folder as `(id, relative path)`, in path order; new ones get new ids.
    fn discover(&self, kind: Kind) -> Vec<(usize, PathBuf)> {
        let found = match kind {
            Kind::Run => vec![PathBuf::new()],
            Kind::Experiment => {
                let mut v = Vec::new();
                find_runs(&self.root, Path::new(""), 0, &mut v);
                v
            }
        };
        let mut runs = lock(&self.runs);
        let mut out = Vec::with_capacity(found.len());
        for rel in found {
            let id = match runs.iter().position(|r| *r == rel) {
                Some(i) => i,
                None => {
                    runs.push(rel.clone());
                    runs.len() - 1
                }
            };
            out.push((id, rel));
        }
        out
    }

    fn run_dir(&self, id: usize) -> Option<(PathBuf, RunDir)> {
        let rel = lock(&self.runs).get(id).cloned()?;
        let dir = RunDir::new(self.root.join(&rel));
        Some((rel, dir))
    }

    fn label(&self, rel: &Path) -> String {
        if rel.as_os_str().is_empty() {
            return self
                .root
                .file_name()
                .map_or_else(|| self.root.display().to_string(), |n| n.to_string_lossy().into());
        }
        rel.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join(" / ")
    }

    /// Answer one request (blocking: it reads files).
    pub fn handle(&self, req: &Request) -> Response {
        if let Some(a) = assets::asset(&req.path) {
            return Response::new(200, a.content_type, a.body);
        }
        let result = match req.path.as_str() {
            "/api/run" => self.api_run(req).map(|v| v.to_string().into_bytes()),
            "/api/trees" => self.api_trees(req).map(|b| b.to_vec()),
            "/api/experiment" => self.api_experiment().map(|v| v.to_string().into_bytes()),
            p if p.starts_with("/api/") => Err(api_err(404, format!("no API route {p}"))),
            _ => return Response::new(404, "text/plain; charset=utf-8", "not found\n"),
        };
        match result {
            Ok(body) => Response::new(200, JSON, body),
            Err(e) => Response::error(e.status, e.message),
        }
    }

    /// The run a request names with `run=<id>` among `runs`, or the first of them.
    fn pick_run(&self, req: &Request, runs: &[(usize, PathBuf)]) -> Result<Option<(usize, PathBuf, RunDir)>, ApiError> {
        let id = match req.param("run") {
            None | Some("") => match runs.first() {
                Some((id, _)) => *id,
                None => return Ok(None),
            },
            Some(s) => s.parse::<usize>().map_err(|_| api_err(400, format!("run must be a run number, not {s:?}")))?,
        };
        if !runs.iter().any(|(i, _)| *i == id) {
            return Err(api_err(404, format!("no run {id} in this folder")));
        }
        let (rel, dir) = self.run_dir(id).ok_or_else(|| api_err(404, format!("no run {id} in this folder")))?;
        Ok(Some((id, rel, dir)))
    }

    fn metrics_of(&self, id: usize, dir: &RunDir, warnings: &mut Vec<String>) -> Vec<StepMetrics> {
        match dir.metrics() {
            Ok(m) => {
                lock(&self.metrics).insert(id, m.clone());
                m
            }
            Err(e) => {
                warnings.push(format!("metrics: {e} (showing the last readable ones)"));
                lock(&self.metrics).get(&id).cloned().unwrap_or_default()
            }
        }
    }

    /// `GET /api/run[?run=ID]`: the folder's kind and runs, and one run's tree steps, metrics,
    /// evaluations and configuration.
    fn api_run(&self, req: &Request) -> Result<Value, ApiError> {
        let kind = self.kind();
        let found = self.discover(kind);
        let picked = self.pick_run(req, &found)?;
        let runs: Vec<Value> = found.iter().map(|(id, rel)| json!({ "run": id, "label": self.label(rel) })).collect();
        let mut warnings = Vec::new();
        let Some((id, rel, dir)) = picked else {
            return Ok(json!({
                "kind": kind.name(), "path": self.root.display().to_string(), "runs": runs, "run": null,
                "label": null, "steps": [], "metrics": [], "evals": [], "config": null, "warnings": warnings,
            }));
        };
        let steps = dir.tree_steps().unwrap_or_else(|e| {
            warnings.push(format!("trees: {e}"));
            Vec::new()
        });
        let metrics = self.metrics_of(id, &dir, &mut warnings);
        let evals = dir.evals().unwrap_or_else(|e| {
            warnings.push(format!("evaluations: {e}"));
            Vec::new()
        });
        let config = std::fs::read_to_string(dir.config_path()).ok();
        Ok(json!({
            "kind": kind.name(),
            "path": self.root.display().to_string(),
            "runs": runs,
            "run": id,
            "label": self.label(&rel),
            "steps": steps,
            "metrics": metrics,
            "evals": evals,
            "config": config,
            "warnings": warnings,
        }))
    }

    /// `GET /api/trees?step=N[&run=ID]`: the step's recorded prompts, each with a summary.
    fn api_trees(&self, req: &Request) -> Result<Arc<Vec<u8>>, ApiError> {
        let step = match req.param("step") {
            None | Some("") => return Err(api_err(400, "which step? /api/trees?step=N")),
            Some(s) => s.parse::<u64>().map_err(|_| api_err(400, format!("step must be a step number, not {s:?}")))?,
        };
        let found = self.discover(self.kind());
        let Some((id, _, dir)) = self.pick_run(req, &found)? else {
            return Err(api_err(404, "no run in this folder yet"));
        };
        let path = dir.trees_path(step);
        let meta = std::fs::metadata(&path).map_err(|_| api_err(404, format!("no trees recorded for step {step}")))?;
        let stamp = (meta.modified().ok(), meta.len());
        if let Some((m, l, body)) = lock(&self.trees).get(&(id, step))
            && (*m, *l) == stamp
        {
            return Ok(body.clone());
        }
        let prompts = dir.trees(step).map_err(|e| api_err(500, format!("trees of step {step}: {e}")))?;
        let prompts: Vec<Value> = prompts.iter().map(prompt_json).collect();
        let body = Arc::new(json!({ "run": id, "step": step, "prompts": prompts }).to_string().into_bytes());
        let mut cache = lock(&self.trees);
        if cache.len() >= TREES_CACHE {
            cache.clear();
        }
        cache.insert((id, step), (stamp.0, stamp.1, body.clone()));
        Ok(body)
    }

    /// `GET /api/experiment`: per regime, per arm (the runs of one folder, one per seed), the
    /// mean over seeds and its 95% interval of every training curve and of held-out EM per source.
    fn api_experiment(&self) -> Result<Value, ApiError> {
        if self.kind() != Kind::Experiment {
            return Err(api_err(404, "this folder is a run, not an experiment"));
        }
        let mut warnings = Vec::new();
        // (regime, arm) -> [(id, seed label, dir)]
        let mut groups: BTreeMap<(String, String), Vec<SeedRun>> = BTreeMap::new();
        for (id, rel) in self.discover(Kind::Experiment) {
            let parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            let (group, seed) = match parts.split_last() {
                Some((last, rest)) if last.starts_with("seed-") && !rest.is_empty() => (rest.to_vec(), last.clone()),
                _ => (parts.clone(), String::new()),
            };
            let (regime, arm) = if group.len() >= 2 {
                (group[0].clone(), group[1..].join("/"))
            } else {
                (String::new(), group.join("/"))
            };
            groups.entry((regime, arm)).or_default().push((id, seed, RunDir::new(self.root.join(&rel))));
        }
        let mut regimes: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for ((regime, arm), runs) in groups {
            let mut per_run = Vec::new();
            let mut run_list = Vec::new();
            for (id, seed, dir) in &runs {
                let metrics = self.metrics_of(*id, dir, &mut warnings);
                let evals: Vec<EvalPoint> = dir.evals().unwrap_or_else(|e| {
                    warnings.push(format!("evaluations: {e}"));
                    Vec::new()
                });
                let tree_steps = dir.tree_steps().map(|s| s.len()).unwrap_or(0);
                run_list.push(json!({ "run": id, "seed": seed, "steps": metrics.len(), "tree_steps": tree_steps }));
                per_run.push((metrics, evals));
            }
            let mut series = serde_json::Map::new();
            for name in SERIES {
                let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
                for (metrics, _) in &per_run {
                    for m in metrics {
                        if let Some(v) = series_value(m, name).filter(|v| v.is_finite()) {
                            by_step.entry(m.step).or_default().push(v);
                        }
                    }
                }
                series.insert(name.to_string(), band_points(&by_step));
            }
            let mut em: BTreeMap<String, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
            for (_, evals) in &per_run {
                for e in evals {
                    for (source, s) in &e.greedy {
                        if s.score.is_finite() {
                            em.entry(source.clone()).or_default().entry(e.step).or_default().push(s.score);
                        }
                    }
                }
            }
            for (source, by_step) in em {
                series.insert(format!("em:{source}"), band_points(&by_step));
            }
            regimes.entry(regime).or_default().push(json!({
                "label": arm,
                "sweep": arm.starts_with("sweep/"),
                "runs": run_list,
                "series": series,
            }));
        }
        let regimes: Vec<Value> =
            regimes.into_iter().map(|(name, groups)| json!({ "name": name, "groups": groups })).collect();
        Ok(json!({
            "kind": "experiment",
            "path": self.root.display().to_string(),
            "regimes": regimes,
            "warnings": warnings,
        }))
    }
}

/// `[{step, mean, lo, hi, n}]`; `lo` and `hi` are null with fewer than two values.
fn band_points(by_step: &BTreeMap<u64, Vec<f64>>) -> Value {
    let points: Vec<Value> = by_step
        .iter()
        .map(|(step, xs)| {
            let (mean, half) = mean_ci95(xs);
            json!({
                "step": step,
                "mean": mean,
                "lo": half.map(|h| mean - h),
                "hi": half.map(|h| mean + h),
                "n": xs.len(),
            })
        })
        .collect();
    Value::Array(points)
}

/// The mean and the half-width of its 95% Student t interval (none for fewer than two values).
pub fn mean_ci95(xs: &[f64]) -> (f64, Option<f64>) {
    if xs.is_empty() {
        return (0.0, None);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, None);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some(t_975(xs.len() - 1) * var.sqrt() / n.sqrt()))
}

/// The hop count a data source names (`synthetic_2hop` -> 2, `3-hop` -> 3), if any.
pub fn hops(data_source: &str) -> Option<u32> {
    let s = data_source.to_ascii_lowercase();
    s.match_indices("hop").find_map(|(i, _)| {
        let before = s[..i].trim_end_matches(['-', '_', ' ']);
        let digits: String =
            before.chars().rev().take_while(char::is_ascii_digit).collect::<Vec<_>>().into_iter().rev().collect();
        digits.parse().ok()
    })
}

/// A prompt's record with a `summary` the prompt list filters on.
fn prompt_json(p: &PromptTrees) -> Value {
    let leaves: Vec<_> = p.trees.iter().flat_map(|t| &t.nodes).filter_map(|n| n.leaf.as_ref()).collect();
    let rewards: Vec<f64> = leaves.iter().map(|l| l.reward).filter(|r| r.is_finite()).collect();
    let metrics: Vec<f64> = leaves.iter().map(|l| l.metric).filter(|r| r.is_finite()).collect();
    let max = |xs: &[f64]| xs.iter().copied().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let nodes: usize = p.trees.iter().map(|t| t.nodes.len()).sum();
    let summary = json!({
        "trees": p.trees.len(),
        "nodes": nodes,
        "leaves": leaves.len(),
        "kept": leaves.iter().filter(|l| l.kept).count(),
        "branch_points": p.trees.iter().flat_map(|t| &t.nodes).filter(|n| n.children.len() > 1).count(),
        "reward_max": max(&rewards),
        "reward_mean": (!rewards.is_empty()).then(|| rewards.iter().sum::<f64>() / rewards.len() as f64),
        "metric_max": max(&metrics),
        "hops": hops(&p.data_source),
    });
    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut v {
        map.insert("summary".into(), summary);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_counts_from_data_source_names() {
        assert_eq!(hops("synthetic_2hop"), Some(2));
        assert_eq!(hops("synthetic_3hop"), Some(3));
        assert_eq!(hops("musique-4-hop"), Some(4));
        assert_eq!(hops("hotpotqa"), None);
        assert_eq!(hops("hop"), None);
        assert_eq!(hops(""), None);
        assert_eq!(hops("x_99999999999hop"), None, "too big is none, not a panic");
    }

    #[test]
    fn intervals_follow_student_t() {
        assert_eq!(mean_ci95(&[]), (0.0, None));
        assert_eq!(mean_ci95(&[0.5]), (0.5, None));
        let (m, h) = mean_ci95(&[0.0, 1.0]);
        assert!((m - 0.5).abs() < 1e-12);
        // sd = 0.7071, n = 2: 12.706 * 0.7071 / 1.4142 = 6.353
        assert!((h.unwrap() - 6.353).abs() < 1e-3, "{h:?}");
    }
}
