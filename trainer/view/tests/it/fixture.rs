//! The run folders the tests serve. [`written_run`] is the one source of the browser test's run
//! folder: realistic records written through grove-rundir (a Tree-GRPO step's trees with forks,
//! a refused turn, a failed tool call, prompts of 2 and 3 hops and one without a hop count;
//! metrics; evaluations). Everything the tests expect is read back from the folder, so another
//! source (a short real training run) can take its place. [`written_experiment`] lays out an
//! experiment folder of such runs.

use std::collections::BTreeMap;
use std::path::Path;

use grove_rundir::{
    EvalPoint, LeafRecord, NodeRecord, PromptTrees, RunDir, SourceScore, StepMetrics, TREES_VERSION, TreeRecord,
};

/// A run folder with trees for steps 1 and 2, metrics for steps 0 to 2, evaluations at 0 and 2.
pub fn written_run(dir: &Path) -> RunDir {
    let run = RunDir::new(dir);
    run.write_config("method = { kind = \"tree\", m = 2, n = 2, l = 1, k = 3 }\nsteps = 3\n").unwrap();
    for step in 0..3 {
        run.append_metrics(&metrics(step, 0.3 + 0.1 * step as f64)).unwrap();
    }
    for step in 1..=2 {
        run.write_trees(step, &step_trees(step)).unwrap();
    }
    run.write_eval(&eval(0, 0.40)).unwrap();
    run.write_eval(&eval(2, 0.55)).unwrap();
    run
}

/// An experiment folder as `trainer experiment` lays it out: `<regime>/<arm>/seed-<n>/`.
pub fn written_experiment(dir: &Path) {
    std::fs::write(dir.join("experiment.toml"), "seeds = [0, 1]\n").unwrap();
    for (arm, base) in [("chain-n-2", 0.2), ("tree-1-2-1", 0.4)] {
        for seed in 0..2u64 {
            let run = RunDir::new(dir.join("strong").join(arm).join(format!("seed-{seed}")));
            for step in 0..3 {
                run.append_metrics(&metrics(step, base + 0.1 * seed as f64 + 0.01 * step as f64)).unwrap();
            }
            run.write_eval(&eval(3, base + 0.2 * seed as f64)).unwrap();
            if arm.starts_with("tree") {
                run.write_trees(2, &step_trees(2)).unwrap();
            }
        }
    }
    // A learning-rate sweep run, and a checkpoint folder that is not a run.
    let sweep = RunDir::new(dir.join("strong/sweep/lr-1e-4/tree-1-2-1/seed-1000"));
    sweep.append_metrics(&metrics(0, 0.1)).unwrap();
    std::fs::create_dir_all(dir.join("strong/tree-1-2-1/seed-0/checkpoint-3")).unwrap();
}

pub fn metrics(step: u64, reward: f64) -> StepMetrics {
    StepMetrics {
        step,
        lr: 1e-6,
        reward_mean: reward,
        metric_mean: reward * 0.9,
        rows: 24,
        kl: 0.001 * step as f64,
        entropy: 0.8 - 0.05 * step as f64,
        clip_fraction: 0.02,
        tool_calls: 40 + step,
        forks: 8,
        ..Default::default()
    }
}

pub fn eval(step: u64, score: f64) -> EvalPoint {
    let s = |score: f64| SourceScore { questions: 50, score, tool_calls_per_question: 1.8, answered: 49 };
    let greedy: BTreeMap<String, SourceScore> = [
        ("all".to_string(), s(score)),
        ("synthetic_2hop".to_string(), s(score + 0.1)),
        ("synthetic_3hop".to_string(), s(score - 0.1)),
    ]
    .into();
    EvalPoint { step, greedy, sampled: None, selection: None }
}

/// The trees of one step: four prompts.
pub fn step_trees(step: u64) -> Vec<PromptTrees> {
    let questions = [
        ("Who directed the film that won the Harbor Prize in 1987?", "Mara Quell", "synthetic_2hop"),
        ("In which city was the founder of the company that built the Arden Bridge born?", "Velmont", "synthetic_3hop"),
        ("What river flows through the capital of Ostrava Province?", "Lesna", "synthetic_2hop"),
        ("Who wrote the novel The Glass Orchard?", "Ilse Varga", "nq"),
    ];
    questions
        .iter()
        .enumerate()
        .map(|(i, (q, a, source))| prompt(step, i, q, a, source, (i + step as usize) % 3))
        .collect()
}

fn prompt(step: u64, index: usize, question: &str, answer: &str, source: &str, variant: usize) -> PromptTrees {
    let prompt_text = format!(
        "<|im_start|>system\nAnswer the question. Search with <search> query </search>; answer with <answer> \
         answer </answer>.<|im_end|>\n<|im_start|>user\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"
    );
    let trees =
        (0..2).map(|t| tree(index * 2 + t, question, answer, variant + t, step * 100 + index as u64 * 10)).collect();
    PromptTrees {
        version: TREES_VERSION,
        step,
        prompt: index,
        task_id: Some(format!("{source}-{index:04}")),
        question: question.into(),
        golden_answers: vec![answer.into()],
        data_source: source.into(),
        method: "tree (2,2,1)".into(),
        estimator: "tree".into(),
        prompt_text,
        prompt_tokens: 61,
        trees,
    }
}

struct Builder {
    nodes: Vec<NodeRecord>,
}

impl Builder {
    fn add(&mut self, parent: usize, mut n: NodeRecord) -> usize {
        let id = self.nodes.len();
        n.id = id;
        n.parent = Some(parent);
        n.depth = self.nodes[parent].depth + 1;
        self.nodes[parent].children.push(id);
        self.nodes.push(n);
        id
    }
}

fn search(query: &str, episode: u64, env_step: u32, doc: &str) -> NodeRecord {
    NodeRecord {
        kind: "search".into(),
        action: format!("<think>I should look up {query}.</think>\n<search> {query} </search>"),
        content: Some(query.into()),
        observation: format!(
            "\n\n<information>Doc 1 (Title: \"{doc}\") {doc} is described here at length, with the names, \
             places and dates a multi-hop question needs.\nDoc 2 (Title: \"Unrelated\") Nothing useful.</information>\n\n"
        ),
        observation_truncated: env_step > 2,
        tokens: 18 + query.len() / 4,
        observation_tokens: 54,
        episode: Some(episode),
        env_step,
        ..Default::default()
    }
}

fn answer(text: &str, episode: u64, env_step: u32, reward: f64, advantage: f64) -> NodeRecord {
    NodeRecord {
        kind: "answer".into(),
        action: format!("<think>The documents say it.</think>\n<answer> {text} </answer>"),
        content: Some(text.into()),
        tokens: 14,
        episode: Some(episode),
        env_step,
        leaf: Some(LeafRecord {
            reward,
            metric: reward,
            format_valid: Some(true),
            answer: Some(text.into()),
            kept: true,
            advantage: Some(advantage),
            advantage_inter: Some(advantage * 0.6),
            advantage_intra: Some(advantage * 0.4),
        }),
        ..Default::default()
    }
}

/// One tree of a (2,2,1) step: two chains from the root, one forked after its first and second
/// turns. `variant` changes the outcomes: a solved tree, a mixed one, one with a failing tool
/// and a refused fork.
fn tree(group: usize, question: &str, gold: &str, variant: usize, episode: u64) -> TreeRecord {
    let mut b = Builder { nodes: vec![NodeRecord { id: 0, ..Default::default() }] };
    let topic: String = question.split_whitespace().skip(3).take(4).collect::<Vec<_>>().join(" ");
    let (r_main, r_fork, r_late) = match variant % 3 {
        0 => (1.0, 0.0, 1.0),
        1 => (0.0, 0.0, 0.0),
        _ => (1.0, 1.0, 0.0),
    };
    let mean = (r_main + r_fork + r_late) / 3.0;
    let a = |r: f64| r - mean;
    let wrong = "Tomas Brenn";
    let pick = |r: f64| if r > 0.0 { gold } else { wrong };
    let n1 = b.add(0, search(&topic, episode, 1, "Harbor Prize"));
    let n2 = b.add(n1, search(&format!("{topic} founder"), episode, 2, "Arden Works"));
    b.add(n2, answer(pick(r_main), episode, 3, r_main, a(r_main)));
    // Forked after the first turn: a new episode from env step 1.
    let f1 = b.add(n1, search(&format!("{topic} history"), episode + 1, 2, "Old Records"));
    b.add(f1, answer(pick(r_fork), episode + 1, 3, r_fork, a(r_fork)));
    // Forked after the second turn.
    let mut late = answer(pick(r_late), episode + 2, 3, r_late, a(r_late));
    if variant % 3 == 2 {
        // The fork was refused: the trajectory ends here, masked out of training.
        late.failure = Some("step:episode_limit".into());
        if let Some(l) = late.leaf.as_mut() {
            l.kept = false;
            l.advantage = None;
            l.advantage_inter = None;
            l.advantage_intra = None;
        }
    }
    b.add(n2, late);
    // The second chain from the root: a tool call that failed on the server, then an answer.
    let mut t = search(&format!("{topic} in 1987"), episode + 3, 1, "Search backend timeout");
    t.tool_error = Some("backend_timeout".into());
    t.observation = "\n\n<information>search failed: the backend timed out</information>\n\n".into();
    let c1 = b.add(0, t);
    b.add(c1, answer(wrong, episode + 3, 2, 0.0, a(0.0)));
    TreeRecord { group, nodes: b.nodes }
}
