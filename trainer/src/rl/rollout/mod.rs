//! Rollout structures (spec §2): the tree of agent steps a Tree-GRPO rollout grows.

pub mod agent;
mod continuous;
pub mod drive;
pub mod leaves;
pub mod tree;
