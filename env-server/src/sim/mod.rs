//! The simulation core: episodes as entities of a `bevy_ecs` world, advanced one tick at a time
//! by a fixed schedule of systems. It does no I/O: commands come in through [`Sim::submit`],
//! search results through [`Sim::deliver_search`], and each [`Sim::tick`] returns the replies and
//! the search batches for the caller to deliver.

mod actions;
mod components;
mod systems;
mod transcript;

use std::time::Instant;

use bevy_ecs::prelude::*;
use grove_protocol::{RequestId, ServerStats};

pub use actions::{Parsed, parse_text, parse_tool};
pub use components::{BatchId, ConnId, Reply, SearchBatch};
pub use systems::{INVALID_ACTION_FEEDBACK, information, render_prompt};
pub use transcript::{StepRecord, Transcript};

use crate::config::{EpisodeDefaults, LimitsConfig};
use crate::search::{Hit, SearchError};
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
            backends,
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
        let mut schedule = Schedule::default();
        schedule.add_systems(
            (
                systems::ingest,
                systems::apply_search_results,
                systems::resolve_actions,
                systems::dispatch_searches,
                systems::score_finished,
                systems::fail_orphaned_steps,
                systems::emit_replies,
                systems::reap,
            )
                .chain(),
        );
        Sim { world, schedule }
    }

    /// Queue a request from a connection for the next tick.
    pub fn submit(&mut self, conn: ConnId, id: RequestId, request: grove_protocol::Request) {
        self.world.resource_mut::<Inbox>().0.push(Incoming::Request { conn, id, request });
    }

    /// The connection is gone; its episodes are removed at the next tick.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.world.resource_mut::<Inbox>().0.push(Incoming::Disconnected(conn));
    }

    /// Results of a batch returned by [`Sim::tick`], one list per query in batch order.
    pub fn deliver_search(&mut self, batch: BatchId, result: Result<Vec<Vec<Hit>>, SearchError>) {
        self.world.resource_mut::<Inbox>().0.push(Incoming::SearchDone { batch, result });
    }

    /// Run the schedule once.
    pub fn tick(&mut self, now: Instant) -> TickOutput {
        self.world.insert_resource(Now(now));
        self.schedule.run(&mut self.world);
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
        let history = systems::history_of(&self.world, entity)?;
        let components = size_of::<(
            EpisodeKey,
            Task,
            History,
            Turns,
            Phase,
            LineageC,
            Owner,
            Clock,
            Outcome,
            Settings,
        )>();
        Some(components + history.unshared_bytes())
    }
}
