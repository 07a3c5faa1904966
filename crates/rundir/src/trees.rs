//! The rollout trees a step produced, as `trees-<step>.jsonl.gz` keeps them for `trainer view`:
//! one JSON line per recorded prompt ([`PromptTrees`]), gzip-compressed, each line carrying the
//! format's [`TREES_VERSION`]. Per node: the turn's action text and parsed tool call (query or
//! answer), the observation the env answered with, token counts, the env episode it ran in
//! (a child in another episode than its parent was forked there) and the engine sequence kept
//! for expansions there; per leaf: the reward and its
//! parts, and for the leaves that trained, the advantage with its inter- and intra-tree parts.
//! Chain runs record their chains the same way (trees without branch points).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Result, RunDir, RunDirError, format_err, io, write_atomic};

/// The version of the tree records this crate writes. A reader refuses other versions by name.
pub const TREES_VERSION: u32 = 1;

/// One prompt's trees in one training step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptTrees {
    pub version: u32,
    pub step: u64,
    /// The prompt's index within the step (its inter-tree group).
    pub prompt: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    pub question: String,
    pub golden_answers: Vec<String>,
    pub data_source: String,
    /// The method's name (`tree (2,2,1)`, `chain n=4`) and the advantage estimator.
    pub method: String,
    pub estimator: String,
    /// The prompt as the model read it (chat template applied), and its length in tokens.
    pub prompt_text: String,
    pub prompt_tokens: usize,
    pub trees: Vec<TreeRecord>,
}

/// One tree (for chain methods: one chain). Node 0 is the root: the prompt, with no action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreeRecord {
    /// The tree's intra-tree group id within the step.
    pub group: usize,
    pub nodes: Vec<NodeRecord>,
}

/// One agent turn: what the model generated and what the environment answered.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<usize>,
    pub depth: u32,
    pub children: Vec<usize>,
    /// `search`, `answer`, `open` or `invalid`; empty for the root.
    pub kind: String,
    /// The generated text of the turn.
    pub action: String,
    /// The query searched, the page opened or the answer given (the tool call's argument).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The environment's answer shown to the model (documents, a page, an error text).
    pub observation: String,
    pub observation_truncated: bool,
    pub tokens: usize,
    pub observation_tokens: usize,
    /// The env episode the turn ran in and the episode's step count after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode: Option<u64>,
    pub env_step: u32,
    /// The generation engine's sequence that held the state right after this turn, kept so the
    /// tree could expand here (a fork point on the engine side, as `episode` is on the env's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<u64>,
    /// The tool call failed on the server (its error code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_error: Option<String>,
    /// The env-server refused the turn or its episode (`<request>:<code>`); the trajectory ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Set on leaves (nodes that ended a trajectory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf: Option<LeafRecord>,
}

/// The outcome of a trajectory, on its last node.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LeafRecord {
    /// The training reward, and its parts: the answer's EM / F1 and whether the format was valid.
    pub reward: f64,
    pub metric: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format_valid: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The leaf was kept as a training row (`keep_leaves`); only kept leaves have advantages.
    pub kept: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantage: Option<f64>,
    /// The advantage's parts: normalised within the prompt group ("inter") and within the tree
    /// ("intra"), whichever of them the estimator uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantage_inter: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantage_intra: Option<f64>,
}

impl RunDir {
    pub fn trees_path(&self, step: u64) -> PathBuf {
        self.path().join(format!("trees-{step}.jsonl.gz"))
    }

    /// Keep a step's recorded trees (replacing what an interrupted run wrote for that step).
    pub fn write_trees(&self, step: u64, prompts: &[PromptTrees]) -> Result<PathBuf> {
        self.create()?;
        let path = self.trees_path(step);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        for p in prompts {
            let line = serde_json::to_string(p).map_err(|e| format_err(&path, &e))?;
            gz.write_all(line.as_bytes()).and_then(|()| gz.write_all(b"\n")).map_err(io(&path))?;
        }
        let bytes = gz.finish().map_err(io(&path))?;
        write_atomic(&path, &bytes)?;
        Ok(path)
    }

    /// The trees recorded for `step`.
    pub fn trees(&self, step: u64) -> Result<Vec<PromptTrees>> {
        read_trees(&self.trees_path(step))
    }

    /// The steps that have recorded trees, in order.
    pub fn tree_steps(&self) -> Result<Vec<u64>> {
        let mut steps = Vec::new();
        let entries = match std::fs::read_dir(self.path()) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(steps),
            Err(e) => return Err(io(self.path())(e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(Ok(step)) =
                name.strip_prefix("trees-").and_then(|s| s.strip_suffix(".jsonl.gz")).map(str::parse)
            {
                steps.push(step);
            }
        }
        steps.sort_unstable();
        Ok(steps)
    }
}

/// Read a `trees-<step>.jsonl.gz` file; a line of another format version is an error naming it.
pub fn read_trees(path: &Path) -> Result<Vec<PromptTrees>> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(io(path))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| RunDirError::Line { path: path.display().to_string(), line: i + 1, message };
        let value: serde_json::Value = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        let version = value.get("version").and_then(serde_json::Value::as_u64);
        if version != Some(u64::from(TREES_VERSION)) {
            return Err(bad(format!(
                "tree records of version {} (this build reads version {TREES_VERSION})",
                version.map_or("none".to_string(), |v| v.to_string())
            )));
        }
        out.push(serde_json::from_value(value).map_err(|e| bad(e.to_string()))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(step: u64) -> PromptTrees {
        let root = NodeRecord { id: 0, children: vec![1, 2], ..Default::default() };
        let leaf = |id| NodeRecord {
            id,
            parent: Some(0),
            depth: 1,
            kind: "answer".into(),
            action: "<answer> Paris </answer>".into(),
            content: Some("Paris".into()),
            leaf: Some(LeafRecord { reward: 1.0, metric: 1.0, kept: true, advantage: Some(0.5), ..Default::default() }),
            ..Default::default()
        };
        PromptTrees {
            version: TREES_VERSION,
            step,
            prompt: 0,
            task_id: Some("q1".into()),
            question: "Capital of France?".into(),
            golden_answers: vec!["Paris".into()],
            data_source: "nq".into(),
            method: "tree (1,2,1)".into(),
            estimator: "tree".into(),
            prompt_text: "Q: Capital of France?".into(),
            prompt_tokens: 6,
            trees: vec![TreeRecord { group: 0, nodes: vec![root, leaf(1), leaf(2)] }],
        }
    }

    #[test]
    fn trees_round_trip_compressed_and_list_their_steps() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        assert_eq!(run.tree_steps().unwrap(), Vec::<u64>::new());
        run.write_trees(3, &[sample(3)]).unwrap();
        run.write_trees(1, &[sample(1), sample(1)]).unwrap();
        assert_eq!(run.tree_steps().unwrap(), vec![1, 3]);
        assert_eq!(run.trees(3).unwrap(), vec![sample(3)]);
        assert_eq!(run.trees(1).unwrap().len(), 2);
        // Compressed: the gzip magic, not JSON text.
        assert_eq!(&std::fs::read(run.trees_path(3)).unwrap()[..2], &[0x1f, 0x8b]);
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let mut p = sample(0);
        p.version = 2;
        run.write_trees(0, &[p]).unwrap();
        let e = run.trees(0).unwrap_err().to_string();
        assert!(e.contains("version 2") && e.contains("reads version 1"), "{e}");
    }
}
