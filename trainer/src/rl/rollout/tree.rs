//! The tree of one Tree-GRPO rollout (spec §2.2-2.5): a root (the prompt), nodes that are one
//! agent step each (thought + action + observation), leaves where a trajectory ended. Expansion
//! picks N nodes per round uniformly **with replacement** from the root and every non-leaf node;
//! each pick grows a new chain that always ends in a leaf. After the rounds, k leaves are kept
//! (uniformly) and the training rows are the root-to-leaf paths in tree order.

use rand::Rng;
use rand::seq::index::sample;

pub type NodeId = usize;

#[derive(Debug, Clone, PartialEq)]
pub struct Node<P> {
    pub parent: Option<NodeId>,
    /// Root 0; a child is its parent + 1. Equals the number of steps from the root.
    pub depth: u32,
    pub is_leaf: bool,
    pub children: Vec<NodeId>,
    /// The step; `None` for the root.
    pub step: Option<P>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tree<P> {
    nodes: Vec<Node<P>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("node {0} does not exist")]
    NoNode(NodeId),
    #[error("node {0} is a leaf and cannot be expanded")]
    ExpandLeaf(NodeId),
    #[error("a chain must end in a leaf")]
    OpenChain,
    #[error("asked to keep {k} leaves of a tree with {have}")]
    TooFewLeaves { k: usize, have: usize },
}

impl<P> Default for Tree<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> Tree<P> {
    pub fn new() -> Self {
        Self { nodes: vec![Node { parent: None, depth: 0, is_leaf: false, children: Vec::new(), step: None }] }
    }

    pub const ROOT: NodeId = 0;

    pub fn node(&self, id: NodeId) -> Option<&Node<P>> {
        self.nodes.get(id)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Attach a chain of steps below `parent`; each is `(step, ends_the_trajectory)`, and only
    /// the last may (and must) end it. Returns the new node ids in order.
    pub fn add_chain(&mut self, parent: NodeId, chain: Vec<(P, bool)>) -> Result<Vec<NodeId>, TreeError> {
        let p = self.nodes.get(parent).ok_or(TreeError::NoNode(parent))?;
        if p.is_leaf {
            return Err(TreeError::ExpandLeaf(parent));
        }
        let n = chain.len();
        if n == 0 || !chain[n - 1].1 || chain[..n - 1].iter().any(|(_, leaf)| *leaf) {
            return Err(TreeError::OpenChain);
        }
        let mut ids = Vec::with_capacity(n);
        let mut at = parent;
        for (step, is_leaf) in chain {
            let id = self.nodes.len();
            let depth = self.nodes[at].depth + 1;
            self.nodes.push(Node { parent: Some(at), depth, is_leaf, children: Vec::new(), step: Some(step) });
            self.nodes[at].children.push(id);
            ids.push(id);
            at = id;
        }
        Ok(ids)
    }

    /// The root and every node that is not a leaf, in creation order.
    pub fn expandable(&self) -> Vec<NodeId> {
        (0..self.nodes.len()).filter(|&i| !self.nodes[i].is_leaf).collect()
    }

    /// `n` uniform picks with replacement among [`Tree::expandable`] (snapshot at call time).
    pub fn pick(&self, n: usize, rng: &mut impl Rng) -> Vec<NodeId> {
        let candidates = self.expandable();
        (0..n).map(|_| candidates[rng.random_range(0..candidates.len())]).collect()
    }

    /// Leaves in tree order (depth first, children in the order they were added).
    pub fn leaves(&self) -> Vec<NodeId> {
        let mut out = Vec::new();
        let mut stack = vec![Self::ROOT];
        while let Some(id) = stack.pop() {
            let node = &self.nodes[id];
            if node.is_leaf {
                out.push(id);
            }
            stack.extend(node.children.iter().rev());
        }
        out
    }

    /// `k` leaves chosen uniformly without replacement, returned in tree order.
    pub fn keep_leaves(&self, k: usize, rng: &mut impl Rng) -> Result<Vec<NodeId>, TreeError> {
        let leaves = self.leaves();
        if k > leaves.len() {
            return Err(TreeError::TooFewLeaves { k, have: leaves.len() });
        }
        let mut chosen: Vec<usize> = sample(rng, leaves.len(), k).into_vec();
        chosen.sort_unstable();
        Ok(chosen.into_iter().map(|i| leaves[i]).collect())
    }

    /// The steps from the root down to `id`, root excluded.
    pub fn path(&self, id: NodeId) -> Vec<&P> {
        let mut out = Vec::new();
        let mut at = Some(id);
        while let Some(i) = at {
            let node = &self.nodes[i];
            if let Some(step) = &node.step {
                out.push(step);
            }
            at = node.parent;
        }
        out.reverse();
        out
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// The worked example of spec §2.7, tree T1: R1 -> a -> b -> c; picks (a, R1): a -> d -> e,
    /// R1 -> f. Its rows are `a b c`, `a d e`, `f`.
    #[test]
    fn worked_example_tree() {
        let mut t: Tree<&str> = Tree::new();
        let chain = t.add_chain(Tree::<&str>::ROOT, vec![("a", false), ("b", false), ("c", true)]).unwrap();
        let (a, b, c) = (chain[0], chain[1], chain[2]);
        assert_eq!(t.expandable(), vec![Tree::<&str>::ROOT, a, b]);
        assert_eq!(t.node(c).unwrap().depth, 3);
        let de = t.add_chain(a, vec![("d", false), ("e", true)]).unwrap();
        let f = t.add_chain(Tree::<&str>::ROOT, vec![("f", true)]).unwrap();
        assert_eq!(t.leaves(), vec![c, de[1], f[0]]);
        let rows: Vec<Vec<&str>> = t.leaves().into_iter().map(|l| t.path(l).into_iter().copied().collect()).collect();
        assert_eq!(rows, vec![vec!["a", "b", "c"], vec!["a", "d", "e"], vec!["f"]]);
        // 1 + N*L leaves: one per chain.
        assert_eq!(t.leaves().len(), 3);
        // Leaves and chains that do not end are refused.
        assert_eq!(t.add_chain(c, vec![("x", true)]), Err(TreeError::ExpandLeaf(c)));
        assert_eq!(t.add_chain(b, vec![("x", false)]), Err(TreeError::OpenChain));
        assert_eq!(t.add_chain(b, vec![("x", true), ("y", true)]), Err(TreeError::OpenChain));
        assert_eq!(t.add_chain(99, vec![("x", true)]), Err(TreeError::NoNode(99)));
    }

    #[test]
    fn picks_are_uniform_with_replacement_over_root_and_inner_nodes() {
        let mut t: Tree<u32> = Tree::new();
        t.add_chain(Tree::<u32>::ROOT, vec![(1, false), (2, false), (3, true)]).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let picks = t.pick(30_000, &mut rng);
        let mut counts = [0usize; 4];
        for p in &picks {
            counts[*p] += 1;
        }
        assert_eq!(counts[3], 0, "leaves are never picked");
        for c in &counts[..3] {
            assert!((9_300..10_700).contains(c), "{counts:?}");
        }
        // A tree whose first chain answered at once can only grow from the root.
        let mut t: Tree<u32> = Tree::new();
        t.add_chain(Tree::<u32>::ROOT, vec![(1, true)]).unwrap();
        assert_eq!(t.pick(5, &mut rng), vec![Tree::<u32>::ROOT; 5]);
    }

    #[test]
    fn keeping_k_leaves() {
        let mut t: Tree<u32> = Tree::new();
        for i in 0..5 {
            t.add_chain(Tree::<u32>::ROOT, vec![(i, true)]).unwrap();
        }
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        assert_eq!(t.keep_leaves(5, &mut rng).unwrap(), t.leaves());
        let kept = t.keep_leaves(3, &mut rng).unwrap();
        assert_eq!(kept.len(), 3);
        assert!(kept.windows(2).all(|w| w[0] < w[1]), "tree order");
        assert_eq!(t.keep_leaves(6, &mut rng), Err(TreeError::TooFewLeaves { k: 6, have: 5 }));
    }
}
