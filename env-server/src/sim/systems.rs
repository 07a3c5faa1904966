//! The systems of one tick, in order: ingest commands (and search results) -> apply search
//! results -> resolve actions -> queue searches into batches -> score finished episodes -> fail
//! steps whose episodes vanished -> emit replies -> reap idle episodes.

// bevy system parameters (`Query`, `Res`, `Commands`) are taken by value and read better without
// their lifetimes.
#![allow(elided_lifetimes_in_paths, clippy::needless_pass_by_value)]

use std::collections::HashSet;

use bevy_ecs::prelude::*;
use grove_datasets::metrics::{Scored, compute_reward};
use grove_protocol::*;

use super::components::*;
use super::episodes::{batch_error, close, create, existing, fork, owner_is, remove};
use super::forest::{ForestHold, Forests};
use super::transcript::{StepRecord, Transcript};
use crate::config::ToolErrors;
use crate::search::{RenderFormat, SearchError, render};
use grove_datasets::actions::{parse_text_with, parse_tool};

/// The fixed message for an action that parses to nothing (Search-R1's corrective feedback).
pub const INVALID_ACTION_FEEDBACK: &str = "\nMy previous action is invalid. If I want to search, I should put the \
query between <search> and </search>. If I want to give the final answer, I should put the answer between \
<answer> and </answer>. Let me try again.\n";

/// Wrap a search result the way the agent sees it.
pub fn information(docs: &str) -> String {
    format!("\n\n<information>{}</information>\n\n", docs.trim())
}

fn reply(conn: ConnId, id: RequestId, msg: Response) -> Reply {
    Reply { conn, envelope: Envelope::new(id, msg), latency: None }
}

// ---------------------------------------------------------------------------------------------
// ingest (exclusive): create, step intake, fork, close, transcript, stats, disconnect

pub fn ingest(world: &mut World) {
    let incoming = std::mem::take(&mut world.resource_mut::<Inbox>().0);
    for item in incoming {
        match item {
            Incoming::Request { conn, id, request } => handle_request(world, conn, id, request),
            Incoming::Disconnected(conn) => disconnect(world, conn),
            Incoming::SearchDone { batch, result } => world.resource_mut::<SearchInbox>().0.push((batch, result)),
        }
    }
}

fn handle_request(world: &mut World, conn: ConnId, id: RequestId, request: Request) {
    let msg = match request {
        Request::CreateEpisodes(c) => create(world, conn, c),
        Request::Step(s) => return step_intake(world, conn, id, s),
        Request::Fork(f) => fork(world, conn, f),
        Request::Close(c) => close(world, conn, &c),
        Request::GetTranscript(t) => transcript(world, conn, t.episode),
        Request::Stats => Response::Stats(stats(world)),
        Request::Ping(p) => Response::Pong(p),
        Request::JoinForest(j) => return super::forest::join(world, conn, id, &j),
        Request::Hello(_) => Response::Error(ErrorInfo::new(
            ErrorCode::HandshakeRequired,
            "Hello is only valid once, as the first request",
        )),
    };
    world.resource_mut::<Outbox>().replies.push(reply(conn, id, msg));
}

/// [`owned`], or a forest episode granted to `conn` (steps and transcripts only).
fn owned_or_held(world: &World, conn: ConnId, episode: EpisodeId) -> Result<Entity, ErrorInfo> {
    let entity = existing(world, episode)?;
    match world.get::<ForestHold>(entity) {
        Some(h) if h.holder == conn => Ok(entity),
        _ => owner_is(world, conn, episode, entity),
    }
}

fn step_intake(world: &mut World, conn: ConnId, id: RequestId, s: Step) {
    let limits = world.resource::<SimSettings>().limits.clone();
    let received = world.resource::<Now>().0;
    if let Some(e) = batch_error("actions", s.actions.len(), limits.max_batch) {
        world.resource_mut::<Outbox>().replies.push(reply(conn, id, Response::Error(e)));
        return;
    }
    let key = {
        let mut steps = world.resource_mut::<Steps>();
        steps.next += 1;
        let key = steps.next;
        let n = s.actions.len();
        steps.open.insert(key, OpenStep { conn, id, slots: vec![None; n], remaining: n, received });
        key
    };
    let mut seen = HashSet::new();
    for (slot, a) in s.actions.into_iter().enumerate() {
        let checked = owned_or_held(world, conn, a.episode).and_then(|entity| {
            if !seen.insert(a.episode) {
                return Err(ErrorInfo::for_episode(
                    ErrorCode::DuplicateEpisode,
                    a.episode,
                    "episode appears twice in one Step",
                ));
            }
            match world.get::<Phase>(entity) {
                Some(Phase::Done) => {
                    return Err(ErrorInfo::for_episode(ErrorCode::EpisodeDone, a.episode, "the episode has finished"));
                }
                Some(Phase::Searching) => {
                    return Err(ErrorInfo::for_episode(
                        ErrorCode::DuplicateEpisode,
                        a.episode,
                        "a step of this episode is still in flight",
                    ));
                }
                _ if world.get::<PendingAction>(entity).is_some() => {
                    return Err(ErrorInfo::for_episode(
                        ErrorCode::DuplicateEpisode,
                        a.episode,
                        "a step of this episode is still in flight",
                    ));
                }
                _ => {}
            }
            let len = match &a.action {
                Action::Text(t) => t.chars().count(),
                Action::Tool(call) => {
                    call.name.len() + call.arguments.values().map(|v| v.to_string().len()).sum::<usize>()
                }
            };
            if len > limits.max_action_chars {
                return Err(ErrorInfo::for_episode(
                    ErrorCode::ActionTooLong,
                    a.episode,
                    format!("action of {len} characters; the limit is {}", limits.max_action_chars),
                ));
            }
            if let Some(d) = &a.data
                && d.0.len() > limits.max_step_data_bytes
            {
                return Err(ErrorInfo::for_episode(
                    ErrorCode::DataTooLarge,
                    a.episode,
                    format!("{} bytes of step data; the limit is {}", d.0.len(), limits.max_step_data_bytes),
                ));
            }
            Ok(entity)
        });
        match checked {
            Ok(entity) => {
                world.entity_mut(entity).insert(PendingAction { step: key, slot, action: a.action, data: a.data });
            }
            Err(e) => world.resource_mut::<Steps>().fill(key, slot, Err(e)),
        }
    }
}

fn transcript(world: &World, conn: ConnId, episode: EpisodeId) -> Response {
    let entity = match owned_or_held(world, conn, episode) {
        Ok(e) => e,
        Err(e) => return Response::Error(e),
    };
    let e = world.entity(entity);
    let (Some(task), Some(history), Some(lineage), Some(phase), Some(outcome)) =
        (e.get::<Task>(), e.get::<History>(), e.get::<LineageC>(), e.get::<Phase>(), e.get::<Outcome>())
    else {
        return Response::Error(ErrorInfo::for_episode(ErrorCode::Internal, episode, "episode is missing components"));
    };
    Response::Transcript(grove_protocol::Transcript {
        episode,
        task: task.0.spec.clone(),
        prompt: task.0.prompt.clone(),
        lineage: lineage.0.clone(),
        status: if *phase == Phase::Done { EpisodeStatus::Done } else { EpisodeStatus::Active },
        steps: history
            .0
            .steps()
            .into_iter()
            .map(|s| TranscriptStep {
                action: s.action.clone(),
                kind: s.kind,
                content: s.content.clone(),
                observation: s.observation.clone(),
                data: s.data.clone(),
            })
            .collect(),
        reward: outcome.0.clone(),
    })
}

pub fn stats(world: &World) -> ServerStats {
    let c = world.resource::<Counters>();
    let dir = world.resource::<Directory>();
    let settings = world.resource::<SimSettings>();
    let forests = world.resource::<Forests>();
    let now = world.resource::<Now>().0;
    ServerStats {
        episodes_live: dir.live() as u64,
        episodes_created: c.created,
        episodes_closed: c.closed,
        episodes_reaped: c.reaped,
        steps: c.steps,
        forks: c.forks,
        searches: c.searches,
        connections: dir.per_conn.keys().filter(|c| **c < FOREST_OWNER_FLOOR).count() as u64,
        uptime_ms: now.saturating_duration_since(settings.started).as_millis() as u64,
        forests_live: forests.live() as u64,
        forests_finished: forests.finished,
        forests_expired: forests.expired,
        providers: Default::default(),
    }
}

/// A connection went away: its episodes go with it.
fn disconnect(world: &mut World, conn: ConnId) {
    let mine: Vec<(EpisodeId, Entity)> = world
        .query::<(&EpisodeKey, &Owner, Entity)>()
        .iter(world)
        .filter(|(_, o, _)| o.0 == conn)
        .map(|(k, _, e)| (k.0, e))
        .collect();
    for (episode, entity) in mine {
        remove(world, episode, entity);
        world.resource_mut::<Counters>().closed += 1;
    }
    world.resource_mut::<Directory>().per_conn.remove(&conn);
    world.resource_mut::<Steps>().open.retain(|_, s| s.conn != conn);
    super::forest::forget_conn(world, conn);
}

// ---------------------------------------------------------------------------------------------
// resolve: parse actions; answers, invalid actions and forced final turns complete now,
// searches are queued

type StepQuery<'a> = (
    Entity,
    &'a EpisodeKey,
    &'a PendingAction,
    &'a mut History,
    &'a mut Turns,
    &'a mut Phase,
    &'a mut Clock,
    &'a Settings,
);

pub fn resolve_actions(
    mut commands: Commands,
    mut episodes: Query<StepQuery<'_>>,
    mut steps: ResMut<Steps>,
    mut queue: ResMut<SearchQueue>,
    mut counters: ResMut<Counters>,
    settings: Res<SimSettings>,
    now: Res<Now>,
) {
    for (entity, key, pending, mut history, mut turns, mut phase, mut clock, cfg) in &mut episodes {
        commands.entity(entity).remove::<PendingAction>();
        clock.touched = now.0;
        let parsed = match &pending.action {
            Action::Text(t) => Ok((parse_text_with(t, settings.open), t.clone())),
            Action::Tool(call) => parse_tool(call, settings.open),
        };
        let (parsed, action_text) = match parsed {
            Ok(p) => p,
            Err(e) => {
                steps.fill(pending.step, pending.slot, Err(ErrorInfo { episode: Some(key.0), ..e }));
                continue;
            }
        };
        let forced_final = turns.used >= turns.max;
        if !forced_final && matches!(parsed.kind, ActionKind::Search | ActionKind::Open) {
            let chars = parsed.content.chars().count();
            if chars > settings.limits.max_query_chars {
                let msg = format!("query of {chars} characters; the limit is {}", settings.limits.max_query_chars);
                steps.fill(
                    pending.step,
                    pending.slot,
                    Err(ErrorInfo::for_episode(ErrorCode::ActionTooLong, key.0, msg)),
                );
                continue;
            }
            let (tool, group) = if parsed.kind == ActionKind::Open {
                (Tool::Open, (Tool::Open, 0, 0))
            } else {
                (Tool::Search, (Tool::Search, cfg.backend, cfg.topk))
            };
            queue.0.entry(group).or_default().push((entity, parsed.content.clone()));
            *phase = Phase::Searching;
            commands.entity(entity).insert(AwaitingSearch {
                step: pending.step,
                slot: pending.slot,
                action: action_text,
                query: parsed.content,
                tool,
                data: pending.data.clone(),
            });
            continue;
        }
        let (observation, done) = match (forced_final, parsed.kind) {
            (true, _) | (false, ActionKind::Answer) => (String::new(), true),
            _ => (INVALID_ACTION_FEEDBACK.to_string(), false),
        };
        let obs = record_step(
            &mut history,
            &mut turns,
            StepRecord {
                action: action_text,
                kind: parsed.kind,
                content: parsed.content,
                observation,
                data: pending.data.clone(),
            },
            key.0,
            done,
            forced_final,
        );
        counters.steps += 1;
        if done {
            *phase = Phase::Done;
            commands.entity(entity).insert(Finished { step: pending.step, slot: pending.slot });
        }
        steps.fill(pending.step, pending.slot, Ok(obs));
    }
}

/// Append a step and describe it for the client.
fn record_step(
    history: &mut History,
    turns: &mut Turns,
    step: StepRecord,
    episode: EpisodeId,
    done: bool,
    forced_final: bool,
) -> Observation {
    let kind = step.kind;
    let text = step.observation.clone();
    history.0 = history.0.push(step);
    turns.used += 1;
    Observation {
        episode,
        step: history.0.len(),
        kind,
        text,
        done,
        forced_final,
        turns_left: turns.max.saturating_sub(turns.used),
        reward: None,
        error: None,
    }
}

/// Turn this tick's queued searches into batches for the backends.
pub fn dispatch_searches(mut queue: ResMut<SearchQueue>, mut batches: ResMut<Batches>, mut outbox: ResMut<Outbox>) {
    let mut groups: Vec<_> = queue.0.drain().collect();
    groups.sort_by_key(|(k, _)| *k);
    for ((tool, backend, topk), items) in groups {
        batches.next += 1;
        let id = batches.next;
        let (entities, queries): (Vec<Entity>, Vec<String>) = items.into_iter().unzip();
        batches.open.insert(id, entities);
        outbox.searches.push(SearchBatch { id, tool, backend, topk, queries });
    }
}

// ---------------------------------------------------------------------------------------------
// apply search results

type SearchedQuery<'a> =
    (&'a EpisodeKey, &'a AwaitingSearch, &'a mut History, &'a mut Turns, &'a mut Phase, &'a mut Clock, &'a Settings);

// A bevy system: its parameters are what it reads and writes.
#[allow(clippy::too_many_arguments)]
pub fn apply_search_results(
    mut commands: Commands,
    mut inbox: ResMut<SearchInbox>,
    mut batches: ResMut<Batches>,
    mut episodes: Query<SearchedQuery<'_>>,
    mut steps: ResMut<Steps>,
    mut counters: ResMut<Counters>,
    settings: Res<SimSettings>,
    now: Res<Now>,
) {
    for (batch, mut outcomes) in inbox.0.drain(..) {
        let Some(entities) = batches.open.remove(&batch) else { continue };
        counters.searches += entities.len() as u64;
        for (i, entity) in entities.into_iter().enumerate() {
            // The episode may have been closed while its search was out.
            let Ok((key, awaiting, mut history, mut turns, mut phase, mut clock, cfg)) = episodes.get_mut(entity)
            else {
                continue;
            };
            commands.entity(entity).remove::<AwaitingSearch>();
            *phase = Phase::Active;
            clock.touched = now.0;
            let outcome = match outcomes.get_mut(i) {
                Some(o) => std::mem::replace(o, Ok(Vec::new())),
                None => Err(SearchError::BadReply("the backend returned fewer results than queries".into())),
            };
            let kind = if awaiting.tool == Tool::Open { ActionKind::Open } else { ActionKind::Search };
            let (observation, error) = match outcome {
                Ok(hits) if awaiting.tool == Tool::Open => {
                    (information(hits.first().map_or("", |h| h.contents.as_str())), None)
                }
                Ok(hits) => {
                    let format = settings.renders.get(cfg.backend).copied().unwrap_or(RenderFormat::Docs);
                    (information(&render(format, &hits)), None)
                }
                Err(e) => {
                    counters.search_errors += 1;
                    let info = ErrorInfo::for_episode(e.code(), key.0, e.to_string());
                    if settings.tool_errors == ToolErrors::Error {
                        // The step did not happen: the episode is as before, and the client may retry.
                        steps.fill(awaiting.step, awaiting.slot, Err(info));
                        continue;
                    }
                    (information(&tool_failure(awaiting.tool, &awaiting.query, &e)), Some(info))
                }
            };
            let mut obs = record_step(
                &mut history,
                &mut turns,
                StepRecord {
                    action: awaiting.action.clone(),
                    kind,
                    content: awaiting.query.clone(),
                    observation,
                    data: awaiting.data.clone(),
                },
                key.0,
                false,
                false,
            );
            obs.error = error;
            counters.steps += 1;
            steps.fill(awaiting.step, awaiting.slot, Ok(obs));
        }
    }
}

/// What the model reads when its tool call failed: the reference's `Search failed for query: …`
/// with the short reason.
pub fn tool_failure(tool: Tool, query: &str, e: &SearchError) -> String {
    match tool {
        Tool::Search => format!("Search failed for query: {query} ({})", e.short()),
        Tool::Open => format!("Could not open {query} ({})", e.short()),
    }
}

// ---------------------------------------------------------------------------------------------
// score finished episodes

pub fn score_finished(
    mut commands: Commands,
    mut finished: Query<(Entity, &Finished, &Task, &History, &mut Outcome)>,
    mut steps: ResMut<Steps>,
    settings: Res<SimSettings>,
) {
    for (entity, fin, task, history, mut outcome) in &mut finished {
        commands.entity(entity).remove::<Finished>();
        let response = history.0.response_text();
        let r =
            compute_reward(Scored::Response(&response), &task.0.spec.golden_answers, task.0.metric, settings.reward);
        let reward = Reward {
            score: r.score,
            metric: task.0.metric,
            metric_value: r.metric_value,
            answer: r.answer,
            format_valid: r.format_valid,
        };
        if let Some(obs) = steps.observation_mut(fin.step, fin.slot) {
            obs.reward = Some(reward.clone());
        }
        outcome.0 = Some(reward);
    }
}

// ---------------------------------------------------------------------------------------------
// emit completed Step replies

pub fn emit_replies(mut steps: ResMut<Steps>, mut outbox: ResMut<Outbox>, now: Res<Now>) {
    let done: Vec<StepKey> = steps.open.iter().filter(|(_, s)| s.remaining == 0).map(|(k, _)| *k).collect();
    for key in done {
        let Some(open) = steps.open.remove(&key) else { continue };
        let results = open.slots.into_iter().map(|s| s.unwrap_or_else(|| Err(internal_unfilled()))).collect();
        outbox.replies.push(Reply {
            conn: open.conn,
            envelope: Envelope::new(open.id, Response::Stepped(Stepped { results })),
            latency: Some(now.0.saturating_duration_since(open.received)),
        });
    }
}

fn internal_unfilled() -> ErrorInfo {
    ErrorInfo::new(ErrorCode::Internal, "step slot was never resolved")
}

/// Steps whose episodes vanished (closed or reaped while searching) are answered with an error.
pub fn fail_orphaned_steps(mut steps: ResMut<Steps>, episodes: Query<&AwaitingSearch>) {
    if steps.open.is_empty() {
        return;
    }
    let mut waiting: HashSet<(StepKey, usize)> = HashSet::new();
    for a in &episodes {
        waiting.insert((a.step, a.slot));
    }
    let keys: Vec<StepKey> = steps.open.keys().copied().collect();
    for key in keys {
        let Some(open) = steps.open.get(&key) else { continue };
        let missing: Vec<usize> = open
            .slots
            .iter()
            .enumerate()
            .filter(|(slot, s)| s.is_none() && !waiting.contains(&(key, *slot)))
            .map(|(slot, _)| slot)
            .collect();
        for slot in missing {
            steps.fill(
                key,
                slot,
                Err(ErrorInfo::new(ErrorCode::UnknownEpisode, "the episode was closed during its step")),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// reap idle episodes

pub fn reap(
    mut commands: Commands,
    episodes: Query<(Entity, &EpisodeKey, &Clock, &Owner, &Phase)>,
    mut dir: ResMut<Directory>,
    mut counters: ResMut<Counters>,
    settings: Res<SimSettings>,
    now: Res<Now>,
) {
    let idle = settings.limits.idle_timeout();
    let max_age = std::time::Duration::from_secs(settings.limits.max_episode_age_secs);
    for (entity, key, clock, owner, phase) in &episodes {
        let idle_too_long = now.0.saturating_duration_since(clock.touched) >= idle;
        let too_old = now.0.saturating_duration_since(clock.created) >= max_age;
        // A forest's episodes live as long as the forest (its timeout reclaims them).
        if *phase == Phase::Searching || owner.0 >= FOREST_OWNER_FLOOR || !(idle_too_long || too_old) {
            continue;
        }
        commands.entity(entity).despawn();
        dir.forget(key.0, Some(owner.0));
        counters.reaped += 1;
    }
}

/// Transcript handle of an episode, for tests and benches in this crate.
pub fn history_of(world: &World, entity: Entity) -> Option<Transcript> {
    world.get::<History>(entity).map(|h| h.0.clone())
}
