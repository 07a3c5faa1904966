//! The requests that make and end episodes (create, fork, close) and who may touch an episode:
//! entity lookups and the per-connection and server-wide limits. Used by the ingest system and by
//! forests, which create, fork and remove episodes on their rows' behalf.

use std::sync::Arc;

use bevy_ecs::prelude::*;
use grove_protocol::*;

use super::components::*;

/// The entity of `episode`, if it exists.
pub(super) fn existing(world: &World, episode: EpisodeId) -> Result<Entity, ErrorInfo> {
    world
        .resource::<Directory>()
        .by_id
        .get(&episode)
        .copied()
        .ok_or_else(|| ErrorInfo::for_episode(ErrorCode::UnknownEpisode, episode, format!("no episode {episode}")))
}

/// The entity of `episode` if it exists and belongs to `conn`.
pub(super) fn owned(world: &World, conn: ConnId, episode: EpisodeId) -> Result<Entity, ErrorInfo> {
    let entity = existing(world, episode)?;
    owner_is(world, conn, episode, entity)
}

pub(super) fn owner_is(world: &World, conn: ConnId, episode: EpisodeId, entity: Entity) -> Result<Entity, ErrorInfo> {
    match world.get::<Owner>(entity) {
        Some(Owner(o)) if *o == conn => Ok(entity),
        Some(Owner(o)) if *o >= FOREST_OWNER_FLOOR => Err(ErrorInfo::for_episode(
            ErrorCode::NotOwner,
            episode,
            "the episode belongs to a forest: its row may step and read it, only the forest forks and closes it",
        )),
        _ => Err(ErrorInfo::for_episode(ErrorCode::NotOwner, episode, "the episode belongs to another connection")),
    }
}

/// Room for `n` more episodes on `conn`?
fn capacity_error(world: &World, conn: ConnId, n: usize) -> Option<ErrorInfo> {
    let dir = world.resource::<Directory>();
    let limits = &world.resource::<SimSettings>().limits;
    let mine = dir.per_conn.get(&conn).copied().unwrap_or(0);
    if mine + n > limits.max_episodes_per_connection {
        return Some(ErrorInfo::new(
            ErrorCode::TooManyEpisodes,
            format!("this connection holds {mine} episodes; the limit is {}", limits.max_episodes_per_connection),
        ));
    }
    if dir.live() + n > limits.max_episodes_total {
        return Some(ErrorInfo::new(
            ErrorCode::TooManyEpisodes,
            format!("the server holds {} episodes; the limit is {}", dir.live(), limits.max_episodes_total),
        ));
    }
    None
}

pub(super) fn batch_error(what: &str, n: usize, max: usize) -> Option<ErrorInfo> {
    (n > max)
        .then(|| ErrorInfo::new(ErrorCode::BatchTooLarge, format!("{n} {what} in one request; the limit is {max}")))
}

fn new_episode_id(world: &mut World, conn: ConnId) -> EpisodeId {
    let mut dir = world.resource_mut::<Directory>();
    dir.next_episode += 1;
    *dir.per_conn.entry(conn).or_default() += 1;
    dir.next_episode
}

pub(super) fn create(world: &mut World, conn: ConnId, c: CreateEpisodes) -> Response {
    let settings = world.resource::<SimSettings>().clone();
    if let Some(e) = batch_error("tasks", c.tasks.len(), settings.limits.max_batch) {
        return Response::Error(e);
    }
    if let Some(e) = capacity_error(world, conn, c.tasks.len()) {
        return Response::Error(e);
    }
    let opts = &c.options;
    let max_turns = opts.max_turns.unwrap_or(settings.max_turns);
    if max_turns > settings.limits.max_turns {
        return Response::Error(ErrorInfo::new(
            ErrorCode::BatchTooLarge,
            format!("max_turns {max_turns} is above the server's limit {}", settings.limits.max_turns),
        ));
    }
    // Every episode copies its rendered prompt, so a long template would be multiplied by the
    // batch size: it is held to `max_action_chars`, like a question.
    if let Some(t) = &opts.prompt_template
        && t.chars().count() > settings.limits.max_action_chars
    {
        return Response::Error(ErrorInfo::new(
            ErrorCode::ActionTooLong,
            format!("prompt_template is longer than {} characters", settings.limits.max_action_chars),
        ));
    }
    // A template without the placeholder would drop the question from every prompt.
    if let Some(t) = &opts.prompt_template
        && !t.contains("{question}")
    {
        return Response::Error(ErrorInfo::new(
            ErrorCode::InvalidAction,
            "prompt_template must contain {question}: without it the model never sees the question",
        ));
    }
    let topk = opts.topk.filter(|k| *k > 0).unwrap_or(settings.topk).min(settings.limits.max_topk);
    let backend = match &opts.backend {
        None => 0,
        Some(name) => match settings.backends.iter().position(|b| b == name) {
            Some(i) => i,
            None => {
                return Response::Error(ErrorInfo::new(
                    ErrorCode::UnknownBackend,
                    format!("no backend `{name}`; this server has {:?}", settings.backends),
                ));
            }
        },
    };
    let template = opts.prompt_template.as_deref().unwrap_or(&settings.prompt_template).to_string();
    let now = world.resource::<Now>().0;
    let mut episodes = Vec::with_capacity(c.tasks.len());
    for task in c.tasks {
        let too_long = task.question.chars().count() > settings.limits.max_action_chars;
        if too_long || task.golden_answers.is_empty() {
            let why = if too_long { "question is too long" } else { "a task needs at least one gold answer" };
            let code = if too_long { ErrorCode::ActionTooLong } else { ErrorCode::InvalidAction };
            episodes.push(Err(ErrorInfo::new(code, why)));
            continue;
        }
        let id = new_episode_id(world, conn);
        let prompt = grove_datasets::render_prompt(&template, &task.question);
        let metric = grove_datasets::task_metric(&task);
        let info = Arc::new(TaskInfo { spec: task, prompt: prompt.clone(), metric });
        let entity = world
            .spawn((
                EpisodeKey(id),
                Task(info),
                History::default(),
                Turns { used: 0, max: max_turns },
                Phase::Active,
                LineageC(Lineage { root: id, parent: None, depth: 0, fork_step: None }),
                Owner(conn),
                Clock { created: now, touched: now },
                Outcome::default(),
                Settings { topk, backend },
            ))
            .id();
        world.resource_mut::<Directory>().by_id.insert(id, entity);
        world.resource_mut::<Counters>().created += 1;
        episodes.push(Ok(EpisodeStart { episode: id, prompt, max_turns }));
    }
    Response::EpisodesCreated(EpisodesCreated { episodes })
}

pub(super) fn fork(world: &mut World, conn: ConnId, f: Fork) -> Response {
    let limits = world.resource::<SimSettings>().limits.clone();
    let total: usize = f.forks.iter().map(|s| s.n as usize).sum();
    if let Some(e) = batch_error("forks", f.forks.len(), limits.max_batch)
        .or_else(|| batch_error("children", total, limits.max_forks_per_request))
    {
        return Response::Error(e);
    }
    let now = world.resource::<Now>().0;
    let mut results = Vec::with_capacity(f.forks.len());
    for spec in f.forks {
        results.push(fork_one(world, conn, &spec, now));
    }
    Response::Forked(Forked { results })
}

pub(super) fn fork_one(
    world: &mut World,
    conn: ConnId,
    spec: &ForkSpec,
    now: std::time::Instant,
) -> Result<ForkResult, ErrorInfo> {
    let parent = owned(world, conn, spec.episode)?;
    if spec.n == 0 {
        return Err(ErrorInfo::for_episode(ErrorCode::InvalidStep, spec.episode, "a fork needs n >= 1"));
    }
    if let Some(e) = capacity_error(world, conn, spec.n as usize) {
        return Err(ErrorInfo { episode: Some(spec.episode), ..e });
    }
    let e = world.entity(parent);
    let (Some(task), Some(history), Some(turns), Some(phase), Some(lineage), Some(outcome), Some(settings)) = (
        e.get::<Task>(),
        e.get::<History>(),
        e.get::<Turns>(),
        e.get::<Phase>(),
        e.get::<LineageC>(),
        e.get::<Outcome>(),
        e.get::<Settings>(),
    ) else {
        return Err(ErrorInfo::for_episode(ErrorCode::Internal, spec.episode, "episode is missing components"));
    };
    let len = history.0.len();
    let Some(prefix) = history.0.prefix(spec.at_step) else {
        return Err(ErrorInfo::for_episode(
            ErrorCode::InvalidStep,
            spec.episode,
            format!("at_step {} is beyond the episode's {len} completed steps", spec.at_step),
        ));
    };
    // Forking a finished episode at its last step gives a finished child with the same reward.
    let ended_here = *phase == Phase::Done && spec.at_step == len;
    let child_phase = if ended_here { Phase::Done } else { Phase::Active };
    let child_outcome = if ended_here { outcome.clone() } else { Outcome::default() };
    let child_lineage = Lineage {
        root: lineage.0.root,
        parent: Some(spec.episode),
        depth: lineage.0.depth + 1,
        fork_step: Some(spec.at_step),
    };
    let bundle = (
        task.clone(),
        History(prefix),
        Turns { used: spec.at_step, max: turns.max },
        child_phase,
        LineageC(child_lineage.clone()),
        Owner(conn),
        Clock { created: now, touched: now },
        child_outcome,
        *settings,
    );
    if let Some(mut c) = world.entity_mut(parent).get_mut::<Clock>() {
        c.touched = now;
    }
    let mut children = Vec::with_capacity(spec.n as usize);
    for _ in 0..spec.n {
        let id = new_episode_id(world, conn);
        let entity = world.spawn((EpisodeKey(id), bundle.clone())).id();
        world.resource_mut::<Directory>().by_id.insert(id, entity);
        children.push(id);
    }
    let mut counters = world.resource_mut::<Counters>();
    counters.forks += spec.n as u64;
    counters.created += spec.n as u64;
    Ok(ForkResult { parent: spec.episode, at_step: spec.at_step, children, lineage: child_lineage })
}

/// Remove an episode entity and its directory entries.
pub(super) fn remove(world: &mut World, episode: EpisodeId, entity: Entity) {
    let owner = world.get::<Owner>(entity).map(|o| o.0);
    world.despawn(entity);
    world.resource_mut::<Directory>().forget(episode, owner);
}

pub(super) fn close(world: &mut World, conn: ConnId, c: &Close) -> Response {
    let max = world.resource::<SimSettings>().limits.max_batch;
    if let Some(e) = batch_error("episodes", c.episodes.len(), max) {
        return Response::Error(e);
    }
    let results = c
        .episodes
        .iter()
        .map(|&episode| {
            let entity = owned(world, conn, episode)?;
            // A search in flight for this episode comes back to an entity that no longer exists;
            // its step reply reports the episode as closed.
            remove(world, episode, entity);
            world.resource_mut::<Counters>().closed += 1;
            Ok(episode)
        })
        .collect();
    Response::Closed(Closed { results })
}
