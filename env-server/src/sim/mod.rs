//! The simulation core: episodes as entities of a `bevy_ecs` world, advanced one tick at a time
//! by a fixed schedule of systems. It does no I/O: commands come in through [`Sim::submit`],
//! search results through [`Sim::deliver_search`], and each [`Sim::tick`] returns the replies and
//! the search batches for the caller to deliver.

mod components;
mod episodes;
mod forest;
mod systems;
mod transcript;

use std::time::Instant;

use bevy_ecs::prelude::*;
use grove_protocol::{RequestId, ServerStats};

pub use components::{BatchId, ConnId, Reply, SearchBatch, SearchResult, Tool};
pub use grove_datasets::actions::{Parsed, parse_text, parse_tool};
pub use grove_datasets::render_prompt;
pub use systems::{INVALID_ACTION_FEEDBACK, information, tool_failure};
pub use transcript::{StepRecord, Transcript};

use crate::config::{EpisodeDefaults, LimitsConfig};
use crate::search::{RenderFormat, SearchError};
use components::*;

/// What one tick produced.
#[derive(Debug, Default)]
pub struct TickOutput {
    pub replies: Vec<Reply>,
    pub searches: Vec<SearchBatch>,
}

/// The world and its schedule. Owned by one thread.
pub struct Sim {
    world: World,
    schedule: Schedule,
    /// The episode defaults' rendering, which overrides every backend's own.
    render_override: Option<RenderFormat>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim").field("episodes", &self.live_episodes()).finish()
    }
}

impl Sim {
    /// `backends` are the names episodes may choose; the first is the default.
    pub fn new(limits: LimitsConfig, defaults: &EpisodeDefaults, backends: Vec<String>) -> Sim {
        let mut world = World::new();
        let now = Instant::now();
        world.insert_resource(SimSettings {
            limits,
            max_turns: defaults.max_turns,
            topk: defaults.topk,
            prompt_template: defaults.prompt_template.clone(),
            reward: defaults.reward.config(),
            renders: vec![defaults.render.unwrap_or(RenderFormat::Docs); backends.len()],
            backends,
            open: false,
            tool_errors: defaults.tool_errors,
            started: now,
        });
        world.insert_resource(Now(now));
        world.init_resource::<Inbox>();
        world.init_resource::<Outbox>();
        world.init_resource::<SearchInbox>();
        world.init_resource::<SearchQueue>();
        world.init_resource::<Batches>();
        world.init_resource::<Steps>();
        world.init_resource::<Directory>();
        world.init_resource::<Counters>();
        world.init_resource::<forest::Forests>();
        let mut schedule = Schedule::default();
        schedule.add_systems(
            (
                systems::ingest,
                systems::apply_search_results,
                systems::resolve_actions,
                systems::dispatch_searches,
                systems::score_finished,
                forest::advance_forests,
                systems::fail_orphaned_steps,
                systems::emit_replies,
                systems::reap,
            )
                .chain(),
        );
        Sim { world, schedule, render_override: defaults.render }
    }

    /// Queue a request from a connection for the next tick.
    pub fn submit(&mut self, conn: ConnId, id: RequestId, request: grove_protocol::Request) {
        self.world.resource_mut::<Inbox>().0.push(Incoming::Request { conn, id, request });
    }

    /// The connection is gone; its episodes are removed at the next tick.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.world.resource_mut::<Inbox>().0.push(Incoming::Disconnected(conn));
    }

    /// Results of a batch returned by [`Sim::tick`], one outcome per query in batch order.
    pub fn deliver_search(&mut self, batch: BatchId, result: SearchResult) {
        self.world.resource_mut::<Inbox>().0.push(Incoming::SearchDone { batch, result });
    }

    /// A batch that failed as a whole: every query of it gets `error`.
    pub fn fail_search(&mut self, batch: BatchId, queries: usize, error: SearchError) {
        self.deliver_search(batch, vec![Err(error); queries]);
    }

    /// How each backend's results are rendered (parallel to the backend names given to
    /// [`Sim::new`]; the episode defaults' `render` overrides them), and whether `open` is a tool.
    pub fn configure_tools(&mut self, renders: &[RenderFormat], open: bool) {
        let over = self.render_override;
        let mut settings = self.world.resource_mut::<SimSettings>();
        let n = settings.backends.len();
        settings.renders =
            (0..n).map(|i| over.or_else(|| renders.get(i).copied()).unwrap_or(RenderFormat::Docs)).collect();
        settings.open = open;
    }

    /// Run the schedule once.
    pub fn tick(&mut self, now: Instant) -> TickOutput {
        self.world.insert_resource(Now(now));
        self.schedule.run(&mut self.world);
        // Every despawned episode records one removed-component message per component; only
        // `clear_trackers` drops them (an `App` would call it each frame). Without it the world
        // grows by ~200 bytes per closed episode, forever.
        self.world.clear_trackers();
        let mut outbox = self.world.resource_mut::<Outbox>();
        TickOutput { replies: std::mem::take(&mut outbox.replies), searches: std::mem::take(&mut outbox.searches) }
    }

    pub fn live_episodes(&self) -> usize {
        self.world.resource::<Directory>().live()
    }

    /// Searches sent to backends whose results have not come back yet.
    pub fn searches_in_flight(&self) -> usize {
        self.world.resource::<Batches>().open.len()
    }

    /// Step requests not yet answered.
    pub fn steps_in_flight(&self) -> usize {
        self.world.resource::<Steps>().open.len()
    }

    pub fn stats(&self) -> ServerStats {
        systems::stats(&self.world)
    }

    pub fn search_errors(&self) -> u64 {
        self.world.resource::<Counters>().search_errors
    }

    /// The transcript handle of an episode (shared structure, not a copy).
    pub fn transcript_of(&self, episode: grove_protocol::EpisodeId) -> Option<Transcript> {
        let entity = *self.world.resource::<Directory>().by_id.get(&episode)?;
        systems::history_of(&self.world, entity)
    }

    /// Bytes of components plus unshared history for one episode: what a fork costs.
    pub fn episode_bytes(&self, episode: grove_protocol::EpisodeId) -> Option<usize> {
        let entity = *self.world.resource::<Directory>().by_id.get(&episode)?;
        // Measured on the world's own handle: a cloned handle would share every node.
        let history = self.world.get::<History>(entity)?.0.unshared_bytes();
        let components =
            size_of::<(EpisodeKey, Task, History, Turns, Phase, LineageC, Owner, Clock, Outcome, Settings)>();
        Some(components + history)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use grove_protocol::*;

    use super::*;
    use crate::config::ServerConfig;

    fn sim() -> Sim {
        let mut config = ServerConfig::default();
        config.limits.max_turns = 100;
        config.limits.idle_timeout_secs = 60;
        Sim::new(config.limits, &config.episodes, vec!["local".into()])
    }

    fn task() -> TaskSpec {
        TaskSpec {
            question: "q".into(),
            golden_answers: vec!["a".into()],
            data_source: "nq".into(),
            task_id: None,
            metric: None,
        }
    }

    /// Create one episode and take `depth` invalid-action steps (no search needed).
    fn episode_at_depth(sim: &mut Sim, depth: u32) -> EpisodeId {
        let opts = EpisodeOptions { max_turns: Some(depth + 5), ..Default::default() };
        sim.submit(1, 1, Request::CreateEpisodes(CreateEpisodes { tasks: vec![task()], options: opts }));
        let out = sim.tick(Instant::now());
        let Response::EpisodesCreated(c) = &out.replies[0].envelope.msg else { panic!("{out:?}") };
        let id = c.episodes[0].as_ref().unwrap().episode;
        for s in 0..depth {
            let a = StepAction {
                episode: id,
                action: Action::Text(format!("step {s} with some words of text")),
                data: None,
            };
            sim.submit(1, 2, Request::Step(Step { actions: vec![a] }));
            sim.tick(Instant::now());
        }
        id
    }

    fn fork_children(sim: &mut Sim, episode: EpisodeId, at_step: u32, n: u32) -> Vec<EpisodeId> {
        sim.submit(1, 3, Request::Fork(Fork { forks: vec![ForkSpec { episode, at_step, n }] }));
        let out = sim.tick(Instant::now());
        let Response::Forked(f) = &out.replies[0].envelope.msg else { panic!("{out:?}") };
        f.results[0].as_ref().unwrap().children.clone()
    }

    #[test]
    fn a_fork_costs_the_same_at_depth_1_and_50() {
        let mut s = sim();
        let shallow = episode_at_depth(&mut s, 1);
        let deep = episode_at_depth(&mut s, 50);
        // Before forking, each parent owns its whole history.
        assert!(s.episode_bytes(deep).unwrap() > s.episode_bytes(shallow).unwrap() + 49 * 40);
        let a = fork_children(&mut s, shallow, 1, 10);
        let b = fork_children(&mut s, deep, 50, 10);
        let bytes_a = s.episode_bytes(a[0]).unwrap();
        let bytes_b = s.episode_bytes(b[0]).unwrap();
        assert_eq!(bytes_a, bytes_b, "a child owns no history of its own");
        assert!(bytes_a < 1024, "{bytes_a} bytes per child");
        // Afterwards the history is shared: nobody owns it alone.
        assert_eq!(s.episode_bytes(deep).unwrap(), bytes_b);
        assert_eq!(s.transcript_of(b[0]).unwrap().len(), 50);
        assert_eq!(s.stats().forks, 20);
    }

    #[test]
    fn idle_episodes_are_reaped_and_active_ones_kept() {
        let mut s = sim();
        let idle = episode_at_depth(&mut s, 0);
        let t0 = Instant::now();
        s.tick(t0 + Duration::from_secs(30));
        assert_eq!(s.live_episodes(), 1);
        // Touch a second episode later; only the first goes idle.
        let busy = episode_at_depth(&mut s, 0);
        assert_ne!(idle, busy);
        let a = StepAction { episode: busy, action: Action::Text("x".into()), data: None };
        s.submit(1, 9, Request::Step(Step { actions: vec![a] }));
        s.tick(t0 + Duration::from_secs(50));
        s.tick(t0 + Duration::from_secs(61));
        assert_eq!(s.live_episodes(), 1);
        assert_eq!(s.stats().episodes_reaped, 1);
        assert!(s.transcript_of(idle).is_none() && s.transcript_of(busy).is_some());
    }

    #[test]
    fn a_closed_episode_with_a_search_in_flight_is_answered() {
        let mut s = sim();
        let e = episode_at_depth(&mut s, 0);
        let a = StepAction { episode: e, action: Action::Text("<search> q </search>".into()), data: None };
        s.submit(1, 10, Request::Step(Step { actions: vec![a] }));
        let out = s.tick(Instant::now());
        assert_eq!(out.searches.len(), 1);
        assert!(out.replies.is_empty(), "the step waits for its search");
        s.submit(1, 11, Request::Close(Close { episodes: vec![e] }));
        let out = s.tick(Instant::now());
        // The close is answered, and the step whose episode vanished is answered with an error.
        let ids: Vec<u64> = out.replies.iter().map(|r| r.envelope.id).collect();
        assert!(ids.contains(&10) && ids.contains(&11), "{ids:?}");
        s.deliver_search(out.searches.first().map_or(1, |b| b.id), vec![Ok(vec![])]);
        let out = s.tick(Instant::now());
        assert!(out.replies.is_empty());
        assert_eq!(s.steps_in_flight(), 0);
    }
}
