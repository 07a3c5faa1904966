//! The RL wing: Tree-GRPO and chain GRPO. The env-server handle (`env`), the rollout method
//! (`method`), the rows a rollout hands to the update (`rows`), the algorithm (`algo/`:
//! advantages, loss, update, schedules), rollouts that grow trees and chains through env-servers
//! (`rollout/`), and the training loop that ties them together (`train/`). Layers, lowest first:
//! env, method, rows, algo; then rollout; then train (ARCHITECTURE.md's `layers` block).

pub mod algo;
pub mod env;
pub mod method;
pub mod rollout;
pub mod rows;
pub mod train;
