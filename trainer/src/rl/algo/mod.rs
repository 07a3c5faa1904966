//! The Tree-GRPO algorithm pieces (`docs/tree-grpo-spec.md` §3 and §5): advantage estimators,
//! the dual-clip PPO loss with k3 KL and entropy bonus, and the learning-rate schedule.

pub mod advantage;
pub mod loss;
pub mod schedule;
pub mod update;
