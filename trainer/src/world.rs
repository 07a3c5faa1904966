//! The synthetic multi-hop world as files on disk: its corpus (wiki-18 JSONL, for an env-server's
//! local index), disjoint training and held-out 2- and 3-hop question sets (QA JSONL), a short
//! agent prompt for small models, and `world.toml`, from which every command that needs the
//! world's entities (the scripted warm-start agent) regenerates it exactly.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use grove_datasets::synthetic::{SyntheticQuestion, World, WorldConfig};

/// A prompt for small models trained from scratch: the action grammar and nothing else, so the
/// few thousand tokens a step can afford go to the search results.
pub const SHORT_PROMPT: &str = "Search with <search> name </search>, then answer with <answer> name </answer>.\n\
Question: {question}\n";

/// What `world.toml` records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldSpec {
    pub seed: u64,
    /// Size factor over [`WorldConfig::default`].
    pub scale: usize,
    /// Training questions per hop count (2 and 3).
    pub train_per_hops: usize,
    /// Held-out questions per hop count.
    pub test_per_hops: usize,
}

impl Default for WorldSpec {
    fn default() -> Self {
        Self { seed: 0, scale: 1, train_per_hops: 200, test_per_hops: 50 }
    }
}

/// The files of a written world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldFiles {
    pub dir: PathBuf,
}

impl WorldFiles {
    pub fn corpus(&self) -> PathBuf {
        self.dir.join("corpus.jsonl")
    }
    pub fn train(&self) -> PathBuf {
        self.dir.join("train.jsonl")
    }
    pub fn test(&self) -> PathBuf {
        self.dir.join("test.jsonl")
    }
    pub fn prompt(&self) -> PathBuf {
        self.dir.join("prompt.txt")
    }
    pub fn spec(&self) -> PathBuf {
        self.dir.join("world.toml")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}: {message}")]
    Spec { path: String, message: String },
    #[error(transparent)]
    Dataset(#[from] grove_datasets::DatasetError),
}

fn io_err(path: &Path, e: &dyn std::fmt::Display) -> WorldError {
    WorldError::Io { path: path.display().to_string(), message: e.to_string() }
}

impl WorldSpec {
    pub fn world(&self) -> World {
        World::generate(&WorldConfig::scaled(self.seed, self.scale))
    }

    /// Training and held-out questions, 2-hop then 3-hop in each; the two sets share no question.
    pub fn questions(&self, world: &World) -> (Vec<SyntheticQuestion>, Vec<SyntheticQuestion>) {
        let mut train = Vec::new();
        let mut test = Vec::new();
        for hops in [2, 3] {
            let (tr, te) = world.split_questions(hops, self.train_per_hops, self.test_per_hops, self.seed + 1);
            train.extend(tr);
            test.extend(te);
        }
        (train, test)
    }

    /// Write the world's files into `dir`.
    pub fn write(&self, dir: &Path) -> Result<WorldFiles, WorldError> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, &e))?;
        let files = WorldFiles { dir: dir.to_path_buf() };
        let world = self.world();
        let (train, test) = self.questions(&world);
        grove_datasets::loaders::write_wiki18(&files.corpus(), &world.passages)?;
        grove_datasets::loaders::write_qa_jsonl(&files.train(), train.iter().map(|q| &q.example))?;
        grove_datasets::loaders::write_qa_jsonl(&files.test(), test.iter().map(|q| &q.example))?;
        std::fs::write(files.prompt(), SHORT_PROMPT).map_err(|e| io_err(&files.prompt(), &e))?;
        let spec = toml::to_string_pretty(self).map_err(|e| io_err(&files.spec(), &e))?;
        std::fs::write(files.spec(), spec).map_err(|e| io_err(&files.spec(), &e))?;
        Ok(files)
    }

    /// Read the `world.toml` of a written world.
    pub fn read(dir: &Path) -> Result<WorldSpec, WorldError> {
        let path = dir.join("world.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| io_err(&path, &e))?;
        toml::from_str(&text).map_err(|e| WorldError::Spec { path: path.display().to_string(), message: e.to_string() })
    }
}
