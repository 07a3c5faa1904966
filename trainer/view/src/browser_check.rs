//! The page checked in a real browser, as a library so that any test can run it on a run folder
//! of its own (grove-view's browser test on a written one, grove-tests' on a short real training
//! run): [`chromium`] finds headless Chromium, [`serve`] starts the view server in-process, and
//! [`check_page`] loads the page of a run folder and checks, over the DevTools protocol
//! ([`cdp`]), that it shows what the folder holds. Only with the `browser-check` feature; test
//! support, so a failed check panics.

pub mod cdp;

use std::cmp::Reverse;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use grove_rundir::{PromptTrees, RunDir};
use tokio::sync::oneshot;

use crate::Server;
pub use cdp::{Browser, Page};

/// Headless Chromium: `GROVE_CHROMIUM`, else `chromium` (or Chrome) on PATH. Missing is a
/// failure, not a skip: `cargo xtask test` installs Debian's package.
pub fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("GROVE_CHROMIUM") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "GROVE_CHROMIUM points at {}, which is not a file", p.display());
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
        if let Some(found) = std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()) {
            return found;
        }
    }
    panic!(
        "the browser test needs headless Chromium and found none: install Debian's `chromium` package \
         (`apt-get install chromium`; `cargo xtask test` does it), or set GROVE_CHROMIUM to a Chromium or \
         Chrome binary"
    );
}

/// A view server running in-process on a free loopback port; stopped when dropped.
#[derive(Debug)]
pub struct Served {
    pub addr: SocketAddr,
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Serve the run or experiment folder `dir` on `127.0.0.1:0` from a task of the current runtime.
pub async fn serve(dir: &Path) -> Served {
    let server = Server::bind(dir, SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind the view server");
    let addr = server.local_addr();
    let url = server.url();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(server.serve(async {
        let _ = rx.await;
    }));
    Served { addr, url, stop: Some(tx) }
}

/// The screenshots [`check_page`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screenshots {
    /// The known prompt's trees with the clicked leaf's transcript.
    pub tree_view: PathBuf,
    /// The training curves with a hover's values.
    pub curves: PathBuf,
}

/// The prompt the test looks at: in the newest step with trees, the one with the most branch
/// points; in it, the tree with the most leaves, and that tree's deepest leaf.
struct Known {
    step: u64,
    prompt: PromptTrees,
    tree: usize,
    node: usize,
}

fn branch_points(p: &PromptTrees) -> usize {
    p.trees.iter().flat_map(|t| &t.nodes).filter(|n| n.children.len() > 1).count()
}

fn known(run: &RunDir) -> Known {
    let step = *run.tree_steps().unwrap().last().expect("the run folder has recorded trees");
    let prompts = run.trees(step).unwrap();
    let prompt = prompts.iter().max_by_key(|p| (branch_points(p), Reverse(p.prompt))).expect("a prompt").clone();
    let tree = (0..prompt.trees.len())
        .max_by_key(|&t| (prompt.trees[t].nodes.iter().filter(|n| n.leaf.is_some()).count(), Reverse(t)))
        .expect("a tree");
    let node = prompt.trees[tree]
        .nodes
        .iter()
        .filter(|n| n.leaf.is_some())
        .max_by_key(|n| (n.depth, Reverse(n.id)))
        .expect("a leaf")
        .id;
    Known { step, prompt, tree, node }
}

/// Load the page of `run` (a run folder with recorded trees) in headless `chromium` and check it
/// against what the folder holds:
/// - the newest step's prompt with the most branch points is drawn with exactly the record's
///   nodes, leaves and branch points, tree by tree, under its question;
/// - a click on the deepest leaf of its fullest tree shows the prompt, every turn's action from
///   the root to it, and the leaf's reward, metric and advantage parts;
/// - the colour toggle (reward / advantage) and the data-source filter work;
/// - a step written while the page is open appears in the step picker (the check writes the
///   newest step's trees again as the next step, so `run` gains a `trees-<step + 1>` file);
/// - the reward curve has a point per metrics line, and a hover shows its values;
/// - no exception, console error, CSP refusal or request to another origin.
///
/// Screenshots of the tree view and of the curves are written to `shots` as
/// `tree-view-<name>.png` and `curves-<name>.png` (their paths printed too). Panics on the first
/// check that fails.
pub async fn check_page(chromium: &Path, run: &RunDir, shots: &Path, name: &str) -> Screenshots {
    let k = known(run);
    let served = serve(run.path()).await;
    let browser = Browser::launch(chromium);
    let mut page = browser.page().await;
    page.viewport(1440, 900).await;
    let p = k.prompt.prompt;
    page.navigate(&format!("{}#step={}&prompt={p}", served.url, k.step)).await;
    let secs = Duration::from_secs(20);
    page.wait_for(
        "the known prompt's trees are drawn",
        &format!(
            "(() => {{ const t = document.querySelector('#trees'); return !!t && t.dataset.step === '{}' && \
             t.dataset.prompt === '{p}' && t.querySelectorAll('g.node').length > 0; }})()",
            k.step
        ),
        secs,
    )
    .await;

    // The drawing matches the record: nodes, leaves and branch points, tree by tree.
    let count = |sel: &str| format!("document.querySelectorAll({}).length", js(sel));
    let all: Vec<_> = k.prompt.trees.iter().flat_map(|t| &t.nodes).collect();
    let leaves = all.iter().filter(|n| n.leaf.is_some()).count();
    assert!(leaves > 0);
    assert_eq!(page.eval(&count("#trees g.node.leaf")).await, leaves, "leaves drawn");
    assert_eq!(page.eval(&count("#trees g.node")).await, all.len(), "nodes drawn");
    assert_eq!(page.eval(&count("#trees g.node.branch")).await, branch_points(&k.prompt), "branch points");
    for (t, tree) in k.prompt.trees.iter().enumerate() {
        let want = tree.nodes.iter().filter(|n| n.leaf.is_some()).count();
        let sel = format!("#trees g.tree[data-tree=\"{t}\"] g.node.leaf");
        assert_eq!(page.eval(&count(&sel)).await, want, "leaves of tree {t}");
    }
    let question = page.eval("document.querySelector('#prompt-head .question').textContent").await;
    assert_eq!(question, k.prompt.question.as_str());

    // Click the deepest leaf of the fullest tree: the transcript shows the prompt and every turn
    // from the root to it, and the leaf's reward and advantage parts.
    let tree = &k.prompt.trees[k.tree];
    let node_sel = format!("#trees g.node[data-tree=\"{}\"][data-node-id=\"{}\"]", k.tree, k.node);
    page.eval(&format!(
        "document.querySelector({}).dispatchEvent(new MouseEvent('click', {{ bubbles: true }}))",
        js(&node_sel)
    ))
    .await;
    let target = &tree.nodes[k.node];
    page.wait_for(
        "the transcript shows the clicked node's action",
        &format!(
            "document.querySelector('#transcript').dataset.node === '{}' && \
             document.querySelector('#transcript').textContent.includes({})",
            k.node,
            js(&target.action)
        ),
        secs,
    )
    .await;
    let transcript = page.eval("document.querySelector('#transcript').textContent").await;
    let transcript = transcript.as_str().unwrap();
    let mut path = vec![target];
    while let Some(parent) = path.last().and_then(|n| n.parent) {
        path.push(&tree.nodes[parent]);
    }
    for n in path.iter().filter(|n| n.parent.is_some()) {
        assert!(transcript.contains(&n.action), "the transcript shows turn {}'s action {:?}", n.id, n.action);
    }
    let prompt_start: String = k.prompt.prompt_text.chars().take(60).collect();
    assert!(transcript.contains(&prompt_start), "the transcript starts with the prompt");
    for label in ["reward", "metric (EM / F1)", "advantage", "inter-tree part", "intra-tree part"] {
        assert!(transcript.contains(label), "the leaf's {label}");
    }
    assert_eq!(page.eval(&count("#trees g.node.selected")).await, 1);
    let tree_view = shots.join(format!("tree-view-{name}.png"));
    page.screenshot(&tree_view).await;
    println!("screenshot of the tree view: {}", tree_view.display());

    // Colour by advantage, and back.
    let set = |sel: &str, value: &str| {
        format!(
            "(() => {{ const s = document.querySelector({}); s.value = {}; s.dispatchEvent(new Event('change')); }})()",
            js(sel),
            js(value)
        )
    };
    page.eval(&set("#color-mode", "advantage")).await;
    page.wait_for("advantage colours", "location.hash.includes('color=advantage')", secs).await;
    assert!(page.eval("document.querySelector('#legend').textContent").await.as_str().unwrap().contains("not trained"));
    assert_eq!(page.eval(&count("#trees g.node.leaf")).await, leaves, "redrawn with the same leaves");
    page.eval(&set("#color-mode", "reward")).await;

    // Filter by data source: the list holds exactly that source's prompts.
    let prompts = run.trees(k.step).unwrap();
    let source = &k.prompt.data_source;
    page.eval(&set("#filter-source", source)).await;
    let want = prompts.iter().filter(|q| &q.data_source == source).count();
    assert_eq!(page.eval(&count("#prompt-list li.prompt")).await, want, "prompts of {source}");
    page.eval(&set("#filter-source", "all")).await;
    assert_eq!(page.eval(&count("#prompt-list li.prompt")).await, prompts.len());

    // The run goes on: a step written now appears in the step picker.
    let next = k.step + 1;
    run.write_trees(next, &prompts).unwrap();
    page.wait_for(
        "a new step appears while the page is open",
        &format!("!!document.querySelector('#step-picker option[value=\"{next}\"]')"),
        Duration::from_secs(15),
    )
    .await;

    // The curves: one point per step, and a hover tells the values.
    page.eval("document.querySelector('#tabs button[data-tab=\"curves\"]').click()").await;
    let steps = run.metrics().unwrap().len();
    let points = count("#curves figure.plot[data-metric=\"reward_mean\"] circle.pt");
    page.wait_for("the reward curve is drawn", &format!("{points} === {steps}"), secs).await;
    page.eval(
        "(() => { const r = document.querySelector('#curves figure.plot[data-metric=\"reward_mean\"] rect.hover'); \
         const b = r.getBoundingClientRect(); r.dispatchEvent(new MouseEvent('mousemove', \
         { bubbles: true, clientX: b.left + b.width - 2, clientY: b.top + b.height / 2 })); })()",
    )
    .await;
    page.wait_for(
        "hovering the curve shows its values",
        "!document.querySelector('#tooltip').hidden && document.querySelector('#tooltip').textContent.includes('step')",
        secs,
    )
    .await;
    let curves = shots.join(format!("curves-{name}.png"));
    page.screenshot(&curves).await;
    println!("screenshot of the curves: {}", curves.display());

    page.eval("1").await; // collect the events still in flight
    let origin = served.url.trim_end_matches('/');
    let problems = page.problems(origin);
    assert!(problems.is_empty(), "the page had problems:\n{}", problems.join("\n"));
    Screenshots { tree_view, curves }
}

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}
