//! Helpers for Grove's cross-crate integration tests (the tests themselves are in `tests/`).

use std::path::PathBuf;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

/// `../shared` beside the repository: fixtures, golden model outputs, docs.
pub fn shared_dir() -> PathBuf {
    repo_root().join("..").join("shared")
}

/// A file of `../shared/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    shared_dir().join("fixtures").join(name)
}

/// An env-server on `127.0.0.1:0`, in this process, serving BM25 over a synthetic world.
#[derive(Debug)]
pub struct WorldServer {
    pub url: String,
    _server: grove_env_server::testkit::LocalServer,
    _dir: tempfile::TempDir,
}

impl WorldServer {
    pub fn start(world: &grove_datasets::synthetic::World) -> WorldServer {
        Self::start_with(world, Default::default(), None)
    }

    /// A server with `config` (limits, defaults) searching `backend` instead of BM25 over the
    /// world's corpus when one is given.
    pub fn start_with(
        world: &grove_datasets::synthetic::World,
        config: grove_env_server::config::ServerConfig,
        backend: Option<std::sync::Arc<dyn grove_env_server::search::SearchBackend>>,
    ) -> WorldServer {
        use grove_env_server::testkit::LocalServer;
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("world.jsonl");
        grove_datasets::loaders::write_wiki18(&corpus, &world.passages).unwrap();
        let server = match backend {
            Some(backend) => {
                LocalServer::start_blocking_with(config, grove_env_server::Backends::new("local", backend))
            }
            None => LocalServer::start_blocking(&corpus, config),
        }
        .unwrap();
        WorldServer { url: server.url(), _server: server, _dir: dir }
    }
}

/// A small world written to disk and a small policy warm-started on it (scripted play, BPE,
/// SFT) that searches and answers, sometimes right: a policy whose rollouts earn rewards.
#[derive(Debug)]
pub struct AnsweringPolicy {
    pub world: grove_trainer::support::world::WorldFiles,
    pub spec: grove_trainer::support::world::WorldSpec,
    pub policy: PathBuf,
    _dir: tempfile::TempDir,
}

/// Built once per test binary (about a minute of CPU in a debug build).
pub fn answering_policy() -> &'static AnsweringPolicy {
    static POLICY: std::sync::OnceLock<AnsweringPolicy> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        use grove_trainer::workflows::warmstart::{WarmStart, warm_start};
        let dir = tempfile::tempdir().unwrap();
        let spec = grove_trainer::support::world::WorldSpec { seed: 0, scale: 1, train_per_hops: 24, test_per_hops: 8 };
        let world = spec.write(&dir.path().join("world")).unwrap();
        let server = WorldServer::start(&spec.world());
        let env = grove_trainer::rl::env::EnvClient::connect(&server.url, Default::default()).unwrap();
        let made = warm_start(&env, &world, &dir.path().join("policy"), &WarmStart::tiny()).unwrap();
        assert!(made.sft.nll_after.unwrap() < made.sft.nll_before.unwrap(), "SFT learned: {:?}", made.sft);
        AnsweringPolicy { world, spec, policy: made.policy, _dir: dir }
    })
}

/// The `config.json` of the tiny Qwen2 policy the training tests use.
pub fn tiny_config_json(vocab: usize) -> String {
    format!(
        r#"{{"model_type": "qwen2", "vocab_size": {vocab}, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true}}"#
    )
}

/// A freshly initialised tiny Qwen2 policy, the same weights every time.
pub fn tiny_policy(vocab: usize) -> (tch::nn::VarStore, grove_trainer::engine::model::CausalLm) {
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let config = grove_trainer::engine::model::ModelConfig::from_json(&tiny_config_json(vocab)).unwrap();
    let lm = grove_trainer::engine::model::CausalLm::new(&vs.root(), config);
    grove_trainer::engine::model::init_normal(&vs, 0, 0.02);
    (vs, lm)
}

/// [`grove_env_server::testkit::CutProxy`] on a runtime of its own, for blocking tests.
#[derive(Debug)]
pub struct CutProxy {
    pub url: String,
    inner: grove_env_server::testkit::CutProxy,
    _rt: tokio::runtime::Runtime,
}

impl CutProxy {
    pub fn start(upstream: &str) -> CutProxy {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let inner = rt.block_on(grove_env_server::testkit::CutProxy::start(upstream)).unwrap();
        CutProxy { url: inner.url.clone(), inner, _rt: rt }
    }
}

impl std::ops::Deref for CutProxy {
    type Target = grove_env_server::testkit::CutProxy;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

/// The agent settings of the rollout tests: 2 tool turns, short observations and 10 new tokens
/// per turn, sampled at T = 1 without truncation.
pub fn tiny_agent_config() -> grove_trainer::rl::rollout::agent::AgentConfig {
    grove_trainer::rl::rollout::agent::AgentConfig {
        max_turns: 2,
        max_obs_tokens: 48,
        max_response_tokens: 4096,
        sampling: grove_trainer::engine::generate::SamplingParams {
            max_new_tokens: 10,
            top_p: 1.0,
            ..grove_trainer::engine::generate::SamplingParams::default()
        },
        prompt_template: None,
        max_context: 4096,
        topk: None,
        schedule: Default::default(),
        max_rows: 0,
    }
}
