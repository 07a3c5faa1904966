//! Advantages (spec §3.3): GRPO normalisation within groups, summed over the prompt group (all
//! leaves of the prompt's trees, "inter") and the tree group (the leaves of one tree, "intra").
//!
//! `norm_S(i) = (R_i - mean_S) / (std_S + 1e-6)` with the unbiased std; a singleton group uses
//! mean 0 and std 1 (so its reward is not centred); a group of equal rewards gives 0.

use std::collections::HashMap;

use crate::rl::rows::TrainingRow;

/// Which groups are normalised and summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// Prompt group only: chain GRPO, or the "inter-tree only" ablation with tree rollouts.
    Grpo,
    /// Tree-GRPO: prompt group + tree group.
    Tree,
    /// Tree group only (the "intra-tree only" ablation; the reference calls it `tree_inner`).
    #[serde(alias = "tree_inner")]
    TreeIntra,
    /// Prompt group only, named for the tree ablation table.
    TreeInter,
}

impl Estimator {
    pub const ALL: [Estimator; 4] = [Estimator::Grpo, Estimator::Tree, Estimator::TreeIntra, Estimator::TreeInter];

    /// Which normalised parts the advantage sums: (within the prompt group "inter", within the
    /// tree "intra").
    pub fn parts(&self) -> (bool, bool) {
        match self {
            Estimator::Grpo | Estimator::TreeInter => (true, false),
            Estimator::TreeIntra => (false, true),
            Estimator::Tree => (true, true),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Estimator::Grpo => "grpo",
            Estimator::Tree => "tree",
            Estimator::TreeIntra => "tree_intra",
            Estimator::TreeInter => "tree_inter",
        }
    }
}

impl std::fmt::Display for Estimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Estimator {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = if s == "tree_inner" { "tree_intra" } else { s };
        Estimator::ALL.into_iter().find(|e| e.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Estimator::ALL.iter().map(|e| e.name()).collect();
            format!("unknown estimator `{s}`: expected one of {}", names.join(", "))
        })
    }
}

pub const EPS: f64 = 1e-6;

/// GRPO-normalised rewards within the groups given by `group[i]`.
pub fn normalise<G: std::hash::Hash + Eq + Copy>(rewards: &[f64], group: &[G]) -> Vec<f64> {
    let mut members: HashMap<G, Vec<usize>> = HashMap::new();
    for (i, g) in group.iter().enumerate() {
        members.entry(*g).or_default().push(i);
    }
    let mut out = vec![0.0; rewards.len()];
    for idx in members.values() {
        let n = idx.len();
        let first = rewards[idx[0]];
        let (mean, std) = if n == 1 {
            (0.0, 1.0)
        } else if idx.iter().all(|&i| rewards[i] == first) {
            // Equal rewards: exactly zero, not a rounding residue of the mean.
            (first, 0.0)
        } else {
            let mean = idx.iter().map(|&i| rewards[i]).sum::<f64>() / n as f64;
            let var = idx.iter().map(|&i| (rewards[i] - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            (mean, var.sqrt())
        };
        for &i in idx {
            out[i] = (rewards[i] - mean) / (std + EPS);
        }
    }
    out
}

/// One scalar advantage per trajectory (leaf), in input order.
pub fn advantages<P, T>(rewards: &[f64], prompt: &[P], tree: &[T], estimator: Estimator) -> Vec<f64>
where
    P: std::hash::Hash + Eq + Copy,
    T: std::hash::Hash + Eq + Copy,
{
    match estimator.parts() {
        (true, false) => normalise(rewards, prompt),
        (false, true) => normalise(rewards, tree),
        _ => {
            let inter = normalise(rewards, prompt);
            let intra = normalise(rewards, tree);
            inter.iter().zip(&intra).map(|(a, b)| a + b).collect()
        }
    }
}

/// One advantage per row: the estimator over the rows that train (a refused row joins no group
/// and gets 0, and is masked out of the loss anyway).
pub fn row_advantages(rows: &[TrainingRow], estimator: Estimator) -> Vec<f64> {
    let g = TrainedGroups::of(rows);
    let adv = advantages(&g.rewards, &g.prompt, &g.tree, estimator);
    let mut out = vec![0.0; rows.len()];
    for (&i, a) in g.rows.iter().zip(adv) {
        out[i] = a;
    }
    out
}

/// The rows that train (a refused row joins no group), with their rewards and group ids in that
/// order: what the advantage estimators read.
#[derive(Debug)]
pub struct TrainedGroups {
    /// Indices into the step's rows.
    pub rows: Vec<usize>,
    pub rewards: Vec<f64>,
    pub prompt: Vec<usize>,
    pub tree: Vec<usize>,
}

impl TrainedGroups {
    pub fn of(rows: &[TrainingRow]) -> Self {
        let trained: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].trains()).collect();
        TrainedGroups {
            rewards: trained.iter().map(|&i| rows[i].reward).collect(),
            prompt: trained.iter().map(|&i| rows[i].prompt_group).collect(),
            tree: trained.iter().map(|&i| rows[i].tree_group).collect(),
            rows: trained,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixture the verl estimator (`clients/verl`, `tree_grpo`) is checked against: the same
    /// rewards, prompt ids and tree ids give the same advantages here.
    #[test]
    fn the_verl_estimators_fixture_gives_the_same_advantages() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/verl/tests/fixtures/tree_advantage.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let cases: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        assert!(cases.len() >= 5);
        for case in &cases {
            let floats =
                |k: &str| -> Vec<f64> { case[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect() };
            let strs = |k: &str| -> Vec<String> {
                case[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
            };
            let (uids, trees) = (strs("uids"), strs("tree_ids"));
            let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
            let trees: Vec<&str> = trees.iter().map(String::as_str).collect();
            let got = advantages(&floats("rewards"), &uids, &trees, Estimator::Tree);
            for (g, w) in got.iter().zip(floats("expected")) {
                assert!((g - w).abs() < 1e-9, "{}: {got:?}", case["name"]);
            }
        }
    }

    /// The worked example of spec §2.7 / §3.3: one prompt, trees t1 = (c, e, f), t2 = (x, z, w).
    #[test]
    fn worked_example_of_the_spec() {
        let r = [1.0, 0.0, 0.2, 1.0, 1.0, 0.0];
        let prompt = [0u64; 6];
        let tree = [1u64, 1, 1, 2, 2, 2];
        let a = advantages(&r, &prompt, &tree, Estimator::Tree);
        // The spec prints sums of rounded parts (-0.646 - 0.378 = -1.024): compare to 1e-3.
        let want = [2.038, -1.789, -1.024, 1.481, 1.481, -2.188];
        for (got, want) in a.iter().zip(want) {
            assert!((got - want).abs() < 1e-3, "{a:?}");
        }
        let inter = advantages(&r, &prompt, &tree, Estimator::TreeInter);
        for (got, want) in inter.iter().zip([0.904, -1.033, -0.646, 0.904, 0.904, -1.033]) {
            assert!((got - want).abs() < 1e-3, "{inter:?}");
        }
        let intra = advantages(&r, &prompt, &tree, Estimator::TreeIntra);
        for (got, want) in intra.iter().zip([1.134, -0.756, -0.378, 0.577, 0.577, -1.155]) {
            assert!((got - want).abs() < 1e-3, "{intra:?}");
        }
        // Step `a` (shared by c and e) gets +0.249 in total, as the spec computes.
        assert!((a[0] + a[1] - 0.249).abs() < 1e-3);
        // Intra-tree advantages sum to zero within each tree.
        assert!((intra[..3].iter().sum::<f64>()).abs() < 1e-9);
    }

    #[test]
    fn singleton_and_equal_groups() {
        // A singleton group is not centred: R / (1 + eps).
        let a = normalise(&[0.7], &[0u8]);
        assert!((a[0] - 0.7 / (1.0 + EPS)).abs() < 1e-12);
        // Equal rewards: zero.
        assert_eq!(normalise(&[0.2, 0.2, 0.2], &[1u8, 1, 1]), vec![0.0, 0.0, 0.0]);
        // With M = 1 the groups coincide and Tree-GRPO doubles GRPO.
        let r = [1.0, 0.0, 0.5];
        let g = advantages(&r, &[0u8; 3], &[0u8; 3], Estimator::Grpo);
        let t = advantages(&r, &[0u8; 3], &[0u8; 3], Estimator::Tree);
        for (a, b) in g.iter().zip(&t) {
            assert!((2.0 * a - b).abs() < 1e-12);
        }
        // Groups are independent of each other and of order.
        let mixed = normalise(&[1.0, 5.0, 0.0, 7.0], &[0u8, 1, 0, 1]);
        let sep = [normalise(&[1.0, 0.0], &[0u8, 0]), normalise(&[5.0, 7.0], &[1u8, 1])];
        assert_eq!(mixed, vec![sep[0][0], sep[1][0], sep[0][1], sep[1][1]]);
    }
}
