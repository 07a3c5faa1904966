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
    _rt: tokio::runtime::Runtime,
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
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("world.jsonl");
        grove_datasets::loaders::write_wiki18(&corpus, &world.passages).unwrap();
        let backend = backend.unwrap_or_else(|| {
            std::sync::Arc::new(
                grove_env_server::search::LocalIndex::open_or_build(&corpus, None, &mut |_| {}).unwrap(),
            )
        });
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let url = format!("ws://{}/", listener.local_addr().unwrap());
        let backends = grove_env_server::Backends::new("local", backend);
        rt.spawn(grove_env_server::run(listener, config, backends, std::future::pending()));
        WorldServer { url, _rt: rt, _dir: dir }
    }
}

/// A small world written to disk and a small policy warm-started on it (scripted play, BPE,
/// SFT) that searches and answers, sometimes right: a policy whose rollouts earn rewards.
#[derive(Debug)]
pub struct AnsweringPolicy {
    pub world: grove_trainer::world::WorldFiles,
    pub spec: grove_trainer::world::WorldSpec,
    pub policy: PathBuf,
    _dir: tempfile::TempDir,
}

/// Built once per test binary (about a minute of CPU in a debug build).
pub fn answering_policy() -> &'static AnsweringPolicy {
    static POLICY: std::sync::OnceLock<AnsweringPolicy> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        use grove_trainer::warmstart::{WarmStart, warm_start};
        let dir = tempfile::tempdir().unwrap();
        let spec = grove_trainer::world::WorldSpec { seed: 0, scale: 1, train_per_hops: 24, test_per_hops: 8 };
        let world = spec.write(&dir.path().join("world")).unwrap();
        let server = WorldServer::start(&spec.world());
        let env = grove_trainer::env::EnvClient::connect(&server.url, Default::default()).unwrap();
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

/// Initialisation reads libtorch's global RNG: tests running in parallel take turns.
static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A freshly initialised tiny Qwen2 policy, the same weights every time.
pub fn tiny_policy(vocab: usize) -> (tch::nn::VarStore, grove_trainer::model::CausalLm) {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(0);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let config = grove_trainer::model::ModelConfig::from_json(&tiny_config_json(vocab)).unwrap();
    let lm = grove_trainer::model::CausalLm::new(&vs.root(), config);
    (vs, lm)
}

/// A loopback TCP proxy in front of a server that can cut every connection through it, to test
/// what survives a dropped connection. `cut_after(bytes)` arms a one-shot cut once that many
/// bytes have gone from the server to clients (counted over all connections), so a cut lands in
/// the middle of a run, mid-frame included; `cut_now` cuts at once. [`CutMode`] says what a cut
/// leaves behind.
#[derive(Debug)]
pub struct CutProxy {
    /// `ws://` address of the proxy.
    pub url: String,
    state: std::sync::Arc<ProxyState>,
    _rt: tokio::runtime::Runtime,
}

#[derive(Debug, Default)]
struct ProxyState {
    down_bytes: std::sync::atomic::AtomicU64,
    cut_at: std::sync::atomic::AtomicU64,
    cuts: std::sync::atomic::AtomicU64,
    accepted: std::sync::atomic::AtomicU64,
    mode: std::sync::atomic::AtomicU8,
    /// New connections are closed at once until this many have been refused.
    refuse: std::sync::atomic::AtomicU64,
    generation: std::sync::Mutex<Option<tokio::sync::watch::Sender<u64>>>,
    graveyard: std::sync::Mutex<Vec<tokio::net::TcpStream>>,
}

impl CutProxy {
    /// A proxy in front of `upstream` (`ws://host:port/`).
    pub fn start(upstream: &str) -> CutProxy {
        use std::sync::atomic::Ordering::SeqCst;
        let upstream = upstream.trim_start_matches("ws://").trim_end_matches('/').to_owned();
        let state = std::sync::Arc::new(ProxyState::default());
        state.cut_at.store(u64::MAX, SeqCst);
        let (gen_tx, gen_rx) = tokio::sync::watch::channel(0u64);
        *state.generation.lock().unwrap() = Some(gen_tx);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let url = format!("ws://{}/", listener.local_addr().unwrap());
        let st = state.clone();
        rt.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                st.accepted.fetch_add(1, SeqCst);
                if st.refuse.load(SeqCst) > 0 {
                    st.refuse.fetch_sub(1, SeqCst);
                    drop(client);
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::spawn(proxy_one(client, server, st.clone(), gen_rx.clone()));
            }
        });
        CutProxy { url, state, _rt: rt }
    }

    /// Cut every connection once `bytes` more bytes have gone from the server to clients.
    pub fn cut_after(&self, bytes: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.state.cut_at.store(self.state.down_bytes.load(SeqCst) + bytes, SeqCst);
    }

    pub fn cut_now(&self) {
        cut(&self.state);
    }

    /// What the next cuts leave behind.
    pub fn set_mode(&self, mode: CutMode) {
        self.state.mode.store(mode as u8, std::sync::atomic::Ordering::SeqCst);
    }

    /// Close the next `n` connections at accept (a server that is unreachable for a while).
    pub fn refuse_next(&self, n: u64) {
        self.state.refuse.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Bytes sent from the server to clients so far.
    pub fn down_bytes(&self) -> u64 {
        self.state.down_bytes.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn cuts(&self) -> u64 {
        self.state.cuts.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// What a cut of [`CutProxy`] leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// Both ends are closed: client and server see the connection end.
    Close = 0,
    /// The client's end is closed; the server's stays open (a peer that vanished without a
    /// reset, as behind a NAT that dropped the flow): the server learns of it from a reattach.
    KeepServerSide = 1,
    /// Nothing is closed and nothing more is forwarded: only a heartbeat notices.
    Freeze = 2,
}

fn cut(state: &ProxyState) {
    state.cuts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if let Some(tx) = state.generation.lock().unwrap().as_ref() {
        tx.send_modify(|g| *g += 1);
    }
}

async fn proxy_one(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    state: std::sync::Arc<ProxyState>,
    mut generation: tokio::sync::watch::Receiver<u64>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let born = *generation.borrow_and_update();
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Forward up to the cut point, then cut: the client may get half a frame.
            let before = state.down_bytes.fetch_add(n as u64, SeqCst);
            let at = state.cut_at.load(SeqCst);
            if before + n as u64 >= at {
                let keep = at.saturating_sub(before) as usize;
                let _ = cw.write_all(&buf[..keep.min(n)]).await;
                state.cut_at.store(u64::MAX, SeqCst);
                cut(&state);
                return;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let cut_signal = generation.wait_for(|g| *g != born);
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut_signal => {}
    }
    let mode = state.mode.load(SeqCst);
    let mut graveyard = state.graveyard.lock().unwrap();
    if mode >= CutMode::KeepServerSide as u8
        && let Ok(server) = sr.reunite(sw)
    {
        graveyard.push(server);
    }
    if mode == CutMode::Freeze as u8
        && let Ok(client) = cr.reunite(cw)
    {
        graveyard.push(client);
    }
}
