//! The measurement wing: what compares and reports. `trainer bench` (`bench/`: throughput and
//! memory against baselines measured in the same run), rollout budgets (`budget`), and the
//! chain-against-tree experiment (`experiment/`: plan, runs, record, analysis, report). The
//! statistics live in grove-rundir (`stats`), shared with `trainer view`.

pub mod bench;
pub mod budget;
pub mod experiment;
