//! The page in a real browser: headless Chromium loads the view of a run folder, and
//! `grove_view::browser_check::check_page` checks, over the DevTools protocol, that a known
//! prompt's trees are drawn with exactly the record's leaves and branch points, that clicking a
//! leaf shows the transcript up to it (every turn's action, the reward and advantage parts), that
//! the filters and the colour toggle work, that a step written while the page is open appears,
//! and that the curves answer a hover. No exception, console error, CSP refusal or request to
//! another origin is allowed. Screenshots are written to `target/tmp/grove-view/`.
//!
//! An experiment folder shows its arms side by side (mean over seeds with a 95% band), and any
//! seed's trees through the run picker.
//!
//! `check_page` takes any run folder with recorded trees and reads what it expects from the
//! folder; here the folder is written by hand (`fixture::written_run`), and grove-tests runs the
//! same check on a short real training run.

use std::path::PathBuf;
use std::time::Duration;

use grove_view::browser_check::{Browser, check_page, chromium};

use crate::fixture::{written_experiment, written_run};
use crate::server::serve;

fn artefacts() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("grove-view")
}

fn artefact(name: &str) -> PathBuf {
    artefacts().join(name)
}

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tree_view_draws_a_known_prompt_and_a_click_shows_the_transcript() {
    let chromium = chromium();
    let dir = tempfile::tempdir().unwrap();
    let run = written_run(dir.path());
    check_page(&chromium, &run, &artefacts(), "written-run").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_experiment_shows_its_arms_side_by_side_with_bands_and_each_seeds_trees() {
    let chromium = chromium();
    let dir = tempfile::tempdir().unwrap();
    written_experiment(dir.path());
    let served = serve(dir.path()).await;
    let browser = Browser::launch(&chromium);
    let mut page = browser.page().await;
    page.viewport(1440, 900).await;
    page.navigate(&format!("{}#tab=curves", served.url)).await;
    let secs = Duration::from_secs(20);
    // Two arms outside the sweep, two seeds each: two lines, two bands.
    let plot = "#curves figure.plot[data-metric=\"strong:reward_mean\"]";
    page.wait_for(
        "the arms' reward curves with their bands",
        &format!(
            "document.querySelectorAll('{plot} path.line').length === 2 && \
             document.querySelectorAll('{plot} path.band').length === 2"
        ),
        secs,
    )
    .await;
    let legend = page.eval(&format!("document.querySelector('{plot} .plot-legend').textContent")).await;
    let legend = legend.as_str().unwrap();
    assert!(legend.contains("chain-n-2 (2 seeds)") && legend.contains("tree-1-2-1 (2 seeds)"), "{legend}");
    assert!(!legend.contains("sweep"), "sweep runs are hidden by default: {legend}");
    let em = "#curves figure.plot[data-metric=\"strong:em:all\"]";
    assert_eq!(page.eval(&format!("document.querySelectorAll('{em} circle.pt').length")).await, 2);
    page.eval(
        "(() => { const c = document.querySelector('#show-sweep'); c.checked = true; \
         c.dispatchEvent(new Event('change')); })()",
    )
    .await;
    page.wait_for(
        "the sweep's arm is added",
        &format!(
            "document.querySelector('{plot} .plot-legend').textContent.includes('sweep/lr-1e-4/tree-1-2-1 (1 seed)')"
        ),
        secs,
    )
    .await;
    page.screenshot(&artefact("experiment-curves.png")).await;

    // A seed's trees, picked by the run picker.
    let label = "strong / tree-1-2-1 / seed-1";
    page.eval(&format!(
        "(() => {{ const s = document.querySelector('#run-picker'); \
         s.value = [...s.options].find((o) => o.textContent === {}).value; \
         s.dispatchEvent(new Event('change')); }})()",
        js(label)
    ))
    .await;
    page.eval("document.querySelector('#tabs button[data-tab=\"trees\"]').click()").await;
    page.wait_for(
        "the seed's trees",
        &format!(
            "document.querySelector('#run-label').title.length > 0 && \
             document.querySelector('#run-picker').selectedOptions[0].textContent === {} && \
             document.querySelectorAll('#trees g.node.leaf').length === 8",
            js(label)
        ),
        secs,
    )
    .await;
    page.screenshot(&artefact("experiment-trees.png")).await;
    page.eval("1").await;
    let problems = page.problems(served.url.trim_end_matches('/'));
    assert!(problems.is_empty(), "the page had problems:\n{}", problems.join("\n"));
}
