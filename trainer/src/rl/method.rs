//! The rollout method of a run (spec §2): Tree-GRPO with a tree shape (M, N, L, k), or chain GRPO
//! with n independent trajectories per prompt. This is the one place that knows a method's
//! budget, label, default estimator and default warm-up; configuration files, the command line,
//! experiments, the bench and budget tables all go through it.
//!
//! In TOML: `method = { kind = "tree", m = 2, n = 2, l = 1, k = 3 }` or
//! `method = { kind = "chain", n = 4 }`. On the command line: `tree:2,2,1,3` or `chain:4`.

use serde::{Deserialize, Serialize};

use crate::rl::algo::advantage::Estimator;

/// The shape a rollout grows per prompt: M trees, N picks per tree per round, L rounds, k leaves
/// kept per tree. Chain GRPO with n trajectories is n one-chain trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeShape {
    pub m: usize,
    pub n: usize,
    pub l: usize,
    pub k: usize,
}

impl TreeShape {
    /// Leaves each tree ends up with: one per chain (spec §2.5).
    pub fn leaves_per_tree(&self) -> usize {
        1 + self.n * self.l
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeParams {
    /// Trees per prompt.
    pub m: usize,
    /// Nodes picked for expansion per tree per round.
    pub n: usize,
    /// Expansion rounds.
    pub l: usize,
    /// Leaves kept per tree (at most 1 + N L; the paper keeps all).
    pub k: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainParams {
    /// Independent trajectories per prompt (the GRPO group size).
    pub n: usize,
}

/// How a prompt's trajectories are rolled out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Method {
    Tree(TreeParams),
    Chain(ChainParams),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodError {
    #[error("unknown method `{0}`: expected `tree:M,N,L,K` (e.g. tree:2,2,1,3) or `chain:N` (e.g. chain:4)")]
    Syntax(String),
    #[error("{0}")]
    Invalid(String),
}

impl Method {
    pub const fn tree(m: usize, n: usize, l: usize, k: usize) -> Self {
        Method::Tree(TreeParams { m, n, l, k })
    }

    pub const fn chain(n: usize) -> Self {
        Method::Chain(ChainParams { n })
    }

    /// The shape of the rollout.
    pub fn shape(&self) -> TreeShape {
        match *self {
            Method::Tree(TreeParams { m, n, l, k }) => TreeShape { m, n, l, k },
            Method::Chain(ChainParams { n }) => TreeShape { m: n, n: 0, l: 0, k: 1 },
        }
    }

    /// Expected rollout budget in complete trajectories per prompt (spec §2.6, the per-tree
    /// formula the paper's tables use): `M (1 + N L / 2)` for a tree, `n` for chains.
    pub fn budget(&self) -> f64 {
        match *self {
            Method::Tree(TreeParams { m, n, l, .. }) => m as f64 * (1.0 + (n * l) as f64 / 2.0),
            Method::Chain(ChainParams { n }) => n as f64,
        }
    }

    /// Training rows per prompt.
    pub fn rows_per_prompt(&self) -> usize {
        let s = self.shape();
        s.m * s.k
    }

    /// `tree (2,2,1)` (the paper's notation, when every leaf is kept), `tree (2,2,1) k=2`, or
    /// `chain n=4`.
    pub fn label(&self) -> String {
        match *self {
            Method::Tree(TreeParams { m, n, l, k }) if k == 1 + n * l => format!("tree ({m},{n},{l})"),
            Method::Tree(TreeParams { m, n, l, k }) => format!("tree ({m},{n},{l}) k={k}"),
            Method::Chain(ChainParams { n }) => format!("chain n={n}"),
        }
    }

    /// The estimator the spec pairs with the method: Tree-GRPO's `tree`, chain GRPO's `grpo`.
    pub fn default_estimator(&self) -> Estimator {
        match self {
            Method::Tree(_) => Estimator::Tree,
            Method::Chain(_) => Estimator::Grpo,
        }
    }

    /// The warm-up ratio of the reference scripts (spec §2.8): 0.285 for trees, 0.5 for chains.
    pub fn default_warmup_ratio(&self) -> f64 {
        match self {
            Method::Tree(_) => 0.285,
            Method::Chain(_) => 0.5,
        }
    }

    /// Check the shape, and resolve the estimator: `explicit` when given (ablations), else the
    /// method's default. Combinations that are not methods of the paper are refused with the
    /// reason.
    pub fn estimator(&self, explicit: Option<Estimator>) -> Result<Estimator, MethodError> {
        self.check()?;
        let estimator = explicit.unwrap_or_else(|| self.default_estimator());
        match (*self, estimator) {
            (Method::Chain(_), Estimator::Tree | Estimator::TreeIntra | Estimator::TreeInter) => {
                Err(MethodError::Invalid(format!(
                    "estimator `{}` needs tree rollouts: a chain is a one-leaf tree, so its intra-tree group is a \
                     single trajectory (mean 0, std 1) and the advantage would add the raw reward (reward-weighted \
                     cloning, not GRPO); chain GRPO uses estimator `grpo`",
                    estimator.name()
                )))
            }
            (Method::Tree(TreeParams { k: 1, .. }), Estimator::Tree | Estimator::TreeIntra) => {
                Err(MethodError::Invalid(format!(
                    "estimator `{}` with k = 1: the intra-tree group is one leaf, its term is the raw reward, not \
                     centred (spec §3.3); keep k >= 2 leaves per tree or use estimator `grpo`",
                    estimator.name()
                )))
            }
            _ => Ok(estimator),
        }
    }

    fn check(&self) -> Result<(), MethodError> {
        match *self {
            Method::Tree(TreeParams { m, n, l, k }) => {
                if m == 0 || k == 0 {
                    return Err(MethodError::Invalid(format!("tree ({m},{n},{l},{k}): M and k must be at least 1")));
                }
                if k > 1 + n * l {
                    return Err(MethodError::Invalid(format!(
                        "tree ({m},{n},{l},{k}): k = {k} leaves kept per tree, but a tree has only 1 + N L = {} \
                         leaves",
                        1 + n * l
                    )));
                }
                if m * k < 2 {
                    return Err(MethodError::Invalid(format!(
                        "tree ({m},{n},{l},{k}): one trajectory per prompt is a group of one, its advantage is not \
                         centred"
                    )));
                }
            }
            Method::Chain(ChainParams { n }) => {
                if n < 2 {
                    return Err(MethodError::Invalid(format!(
                        "chain n={n}: GRPO needs at least 2 trajectories per prompt (a group of one is not centred)"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Method::Tree(TreeParams { m, n, l, k }) => write!(f, "tree:{m},{n},{l},{k}"),
            Method::Chain(ChainParams { n }) => write!(f, "chain:{n}"),
        }
    }
}

impl std::str::FromStr for Method {
    type Err = MethodError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || MethodError::Syntax(s.to_string());
        let (kind, params) = s.trim().split_once(':').ok_or_else(syntax)?;
        let numbers: Vec<usize> =
            params.split(',').map(|x| x.trim().parse()).collect::<Result<_, _>>().map_err(|_| syntax())?;
        match (kind, &numbers[..]) {
            ("tree", &[m, n, l, k]) => Ok(Method::tree(m, n, l, k)),
            ("chain", &[n]) => Ok(Method::chain(n)),
            _ => Err(syntax()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Holder {
        method: Method,
    }

    fn parse(toml_text: &str) -> Result<Method, String> {
        toml::from_str::<Holder>(toml_text).map(|h| h.method).map_err(|e| e.to_string())
    }

    #[test]
    fn toml_is_tagged_and_strict() {
        assert_eq!(parse("method = { kind = \"tree\", m = 2, n = 2, l = 1, k = 3 }"), Ok(Method::tree(2, 2, 1, 3)));
        assert_eq!(parse("[method]\nkind = \"chain\"\nn = 4\n"), Ok(Method::chain(4)));
        let e = parse("method = { kind = \"Chain\", n = 4 }").unwrap_err();
        assert!(e.contains("unknown variant `Chain`") && e.contains("`tree`") && e.contains("`chain`"), "{e}");
        let e = parse("method = { kind = \"chain\", n = 4, m = 2 }").unwrap_err();
        assert!(e.contains("unknown field `m`"), "{e}");
        let e = parse("method = { kind = \"tree\", m = 2, n = 2, l = 1 }").unwrap_err();
        assert!(e.contains("missing field `k`"), "{e}");
        let e = parse("method = \"chain\"").unwrap_err();
        assert!(!e.is_empty());
    }

    #[test]
    fn command_line_syntax_round_trips() {
        for m in [Method::tree(2, 2, 1, 3), Method::chain(4)] {
            assert_eq!(m.to_string().parse::<Method>(), Ok(m));
        }
        for bad in ["tree", "tree:2,2,1", "chain:4,1", "Chain:4", "forest:1", "chain:x"] {
            assert!(matches!(bad.parse::<Method>(), Err(MethodError::Syntax(_))), "{bad}");
        }
    }

    #[test]
    fn budgets_and_labels_follow_the_spec() {
        // Spec §2.6: (2,2,1) -> 4B, (1,2,1) -> 2B, (4,2,1) -> 8B, (2,6,1) -> 8B, (8,2,1) -> 16B.
        for ((m, n, l), b) in
            [((2, 2, 1), 4.0), ((1, 2, 1), 2.0), ((4, 2, 1), 8.0), ((2, 6, 1), 8.0), ((8, 2, 1), 16.0)]
        {
            assert_eq!(Method::tree(m, n, l, 1 + n * l).budget(), b);
        }
        assert_eq!(Method::chain(4).budget(), 4.0);
        assert_eq!(Method::tree(2, 2, 1, 3).label(), "tree (2,2,1)");
        assert_eq!(Method::tree(2, 2, 1, 2).label(), "tree (2,2,1) k=2");
        assert_eq!(Method::chain(4).label(), "chain n=4");
        assert_eq!(Method::tree(2, 2, 1, 3).rows_per_prompt(), 6);
        assert_eq!(Method::chain(4).rows_per_prompt(), 4);
        assert_eq!(Method::chain(4).shape(), TreeShape { m: 4, n: 0, l: 0, k: 1 });
    }

    #[test]
    fn estimators_default_per_method_and_bad_pairs_are_refused() {
        assert_eq!(Method::chain(4).estimator(None), Ok(Estimator::Grpo));
        assert_eq!(Method::tree(2, 2, 1, 3).estimator(None), Ok(Estimator::Tree));
        assert_eq!(Method::tree(2, 2, 1, 3).estimator(Some(Estimator::TreeIntra)), Ok(Estimator::TreeIntra));
        let e = Method::chain(4).estimator(Some(Estimator::Tree)).unwrap_err().to_string();
        assert!(e.contains("needs tree rollouts") && e.contains("`grpo`"), "{e}");
        assert!(Method::tree(2, 2, 1, 1).estimator(None).unwrap_err().to_string().contains("k = 1"));
        assert_eq!(Method::tree(2, 2, 1, 1).estimator(Some(Estimator::Grpo)), Ok(Estimator::Grpo));
        assert!(Method::tree(2, 2, 1, 4).estimator(None).unwrap_err().to_string().contains("only 1 + N L = 3"));
        assert!(Method::chain(1).estimator(None).is_err());
        assert_eq!(Method::tree(2, 2, 1, 3).default_warmup_ratio(), 0.285);
        assert_eq!(Method::chain(4).default_warmup_ratio(), 0.5);
    }
}
