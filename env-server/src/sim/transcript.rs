//! A persistent (structurally shared) list of completed steps. Appending creates one node that
//! points at the previous head; a fork at step k shares the first k nodes with its parent, so a
//! fork costs the same for a 1-step and a 100-step episode.

use std::sync::Arc;

use grove_protocol::{ActionKind, StepData};

/// One completed step as the environment recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// The action text as the agent sent it (a tool call rendered in tag form).
    pub action: String,
    pub kind: ActionKind,
    /// The parsed query, URL or answer.
    pub content: String,
    /// The observation appended after the action (empty for answers and the final turn).
    pub observation: String,
    /// The client's bytes sent with the action (`StepAction::data`).
    pub data: Option<StepData>,
}

#[derive(Debug)]
struct Node {
    step: StepRecord,
    prev: Option<Arc<Node>>,
}

/// Immutable history handle; cloning copies one pointer.
#[derive(Debug, Clone, Default)]
pub struct Transcript {
    head: Option<Arc<Node>>,
    len: u32,
}

impl Transcript {
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A new transcript with `step` appended; `self` is unchanged.
    pub fn push(&self, step: StepRecord) -> Transcript {
        Transcript { head: Some(Arc::new(Node { step, prev: self.head.clone() })), len: self.len + 1 }
    }

    /// The history as it was after `k` steps, sharing its nodes with `self`.
    pub fn prefix(&self, k: u32) -> Option<Transcript> {
        if k > self.len {
            return None;
        }
        let mut head = self.head.clone();
        for _ in k..self.len {
            head = head.and_then(|n| n.prev.clone());
        }
        Some(Transcript { head, len: k })
    }

    /// Steps in order, oldest first.
    pub fn steps(&self) -> Vec<&StepRecord> {
        let mut out = Vec::with_capacity(self.len as usize);
        let mut cur = self.head.as_deref();
        while let Some(n) = cur {
            out.push(&n.step);
            cur = n.prev.as_deref();
        }
        out.reverse();
        out
    }

    /// Everything the agent produced and saw after the prompt: each step's action followed by
    /// its observation. This is what the reward is computed on.
    pub fn response_text(&self) -> String {
        self.steps().iter().map(|s| format!("{}{}", s.action, s.observation)).collect()
    }

    /// Bytes held by nodes that no other transcript shares (what dropping `self` would free).
    pub fn unshared_bytes(&self) -> usize {
        let mut total = 0;
        let mut cur = self.head.as_ref();
        while let Some(n) = cur {
            if Arc::strong_count(n) > 1 {
                break;
            }
            let s = &n.step;
            total += size_of::<Node>()
                + s.action.len()
                + s.content.len()
                + s.observation.len()
                + s.data.as_ref().map_or(0, |d| d.0.len());
            cur = n.prev.as_ref();
        }
        total
    }
}

impl Drop for Transcript {
    /// Iterative drop, so a very long chain cannot overflow the stack.
    fn drop(&mut self) {
        let mut cur = self.head.take();
        while let Some(node) = cur {
            match Arc::try_unwrap(node) {
                Ok(mut n) => cur = n.prev.take(),
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(i: usize) -> StepRecord {
        StepRecord {
            action: format!("a{i}"),
            kind: ActionKind::Search,
            content: format!("q{i}"),
            observation: format!("o{i}"),
            data: None,
        }
    }

    #[test]
    fn prefixes_share_and_diverge() {
        let mut t = Transcript::default();
        for i in 0..5 {
            t = t.push(step(i));
        }
        assert_eq!(t.len(), 5);
        let p2 = t.prefix(2).unwrap();
        assert_eq!(p2.steps(), t.steps()[..2].to_vec());
        let child = p2.push(step(99));
        assert_eq!(child.steps().len(), 3);
        assert_eq!(child.steps()[2].content, "q99");
        assert_eq!(t.steps()[2].content, "q2", "the parent is untouched");
        assert!(t.prefix(6).is_none());
        assert_eq!(t.prefix(0).unwrap().steps().len(), 0);
        assert_eq!(t.response_text(), "a0o0a1o1a2o2a3o3a4o4");
    }

    #[test]
    fn forking_shares_history() {
        let mut t = Transcript::default();
        for i in 0..100 {
            t = t.push(step(i));
        }
        let fork = t.prefix(100).unwrap();
        // Everything is shared: the fork owns nothing of its own.
        assert_eq!(fork.unshared_bytes(), 0);
        drop(t);
        assert!(fork.unshared_bytes() > 0, "after the parent is gone, the fork owns the history");
    }

    #[test]
    fn very_long_chains_drop_without_recursion() {
        let mut t = Transcript::default();
        for i in 0..200_000 {
            t = t.push(StepRecord {
                action: String::new(),
                kind: ActionKind::Invalid,
                content: String::new(),
                observation: i.to_string(),
                data: None,
            });
        }
        drop(t);
    }
}
