//! Forests (PROTOCOL.md §8.7): the trees of one prompt, grown by rows that join with the prompt's
//! key from any connection. The forest owns its episodes (a pseudo-owner per forest, so a row's
//! disconnect or idle reaping never takes them); each row is granted its one episode
//! ([`ForestHold`]) to step and read. Roles go by join order: the first `m` rows play the trees'
//! initial chains; row `m + s` continues from pick `s % n` of tree `(s % (m n)) / n` in round
//! `1 + s / (m n)`, and its reply waits until that tree's earlier rounds have finished, when the
//! round's picks are drawn (spec §2.3: uniform with replacement over the root and every non-leaf
//! step; seeded) and the node is forked.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bevy_ecs::prelude::*;
use grove_protocol::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::components::*;
use super::episodes::{create, fork_one, remove};

/// Grants the session `holder` the right to step and read a forest episode.
#[derive(Component, Debug, Clone, Copy)]
pub struct ForestHold {
    pub holder: ConnId,
}

type ForestId = u64;

#[derive(Debug)]
struct Chain {
    episode: EpisodeId,
    /// The step of the node it continues from (0 for the initial chain and for the root's picks).
    from_step: u32,
    round: u32,
}

#[derive(Debug, Default)]
struct Tree {
    root: Option<EpisodeId>,
    chains: Vec<Chain>,
    /// Per round, the nodes drawn for it.
    picks: BTreeMap<u32, Vec<ForestNode>>,
}

#[derive(Debug)]
struct Waiting {
    conn: ConnId,
    id: RequestId,
    row: u32,
}

#[derive(Debug)]
struct Forest {
    join: JoinForest,
    deadline: Instant,
    joined: u32,
    trees: Vec<Tree>,
    waiting: Vec<Waiting>,
    prompt: String,
    max_turns: u32,
    /// Every row played: the forest takes no more rows, and its episodes stay readable
    /// (`GetTranscript`) until the deadline, when they are closed.
    finished: bool,
}

impl Forest {
    fn owner(id: ForestId) -> ConnId {
        u64::MAX - id
    }

    fn episodes(&self) -> impl Iterator<Item = EpisodeId> + '_ {
        self.trees.iter().flat_map(|t| t.chains.iter().map(|c| c.episode))
    }
}

/// Why a key is no longer live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    Finished,
    Expired,
}

/// Every forest of the server, by key, and the keys of recent finished or expired ones.
#[derive(Resource, Debug, Default)]
pub struct Forests {
    by_key: HashMap<String, ForestId>,
    live: HashMap<ForestId, Forest>,
    gone: HashMap<String, Gone>,
    /// `gone` keys in the order they went, with when to forget them.
    gone_order: VecDeque<(Instant, String)>,
    next: ForestId,
    pub finished: u64,
    pub expired: u64,
}

impl Forests {
    /// Forests still growing (finished ones that only wait to close their episodes excluded).
    pub fn live(&self) -> usize {
        self.live.values().filter(|f| !f.finished).count()
    }
}

const MAX_KEY_CHARS: usize = 256;

fn forest_error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error(ErrorInfo::new(code, message))
}

fn reply(world: &mut World, conn: ConnId, id: RequestId, msg: Response) {
    world.resource_mut::<Outbox>().replies.push(Reply { conn, envelope: Envelope::new(id, msg), latency: None });
}

/// `JoinForest`: answered at once for a root, error or mismatch; queued for an expansion.
pub fn join(world: &mut World, conn: ConnId, id: RequestId, j: &JoinForest) {
    if let Some(err) = check_join(world, j) {
        return reply(world, conn, id, err);
    }
    let existing = world.resource::<Forests>().by_key.get(&j.key).copied();
    let fid = match existing {
        Some(fid) => {
            let now = world.resource::<Now>().0;
            let forests = world.resource::<Forests>();
            let f = &forests.live[&fid];
            if now >= f.deadline && !f.finished {
                let msg = format!("forest `{}` expired", j.key);
                return reply(world, conn, id, forest_error(ErrorCode::ForestExpired, msg));
            }
            if f.join.shape != j.shape
                || f.join.seed != j.seed
                || !same_task(&f.join.task, &j.task)
                || f.join.options != j.options
            {
                let msg = format!(
                    "forest `{}` was started with shape {:?}, seed {}, options {:?} and question {:?}; every row must \
                     send the same",
                    j.key, f.join.shape, f.join.seed, f.join.options, f.join.task.question
                );
                return reply(world, conn, id, forest_error(ErrorCode::ForestMismatch, msg));
            }
            if u64::from(f.joined) >= j.shape.rows() {
                let msg = format!("forest `{}` has all its {} rows", j.key, j.shape.rows());
                return reply(world, conn, id, forest_error(ErrorCode::ForestFull, msg));
            }
            fid
        }
        None => match start(world, j) {
            Ok(fid) => fid,
            Err(e) => return reply(world, conn, id, Response::Error(e)),
        },
    };
    let row = {
        let mut forests = world.resource_mut::<Forests>();
        let Some(f) = forests.live.get_mut(&fid) else { return };
        f.joined += 1;
        f.joined - 1
    };
    if row < j.shape.m {
        match play_root(world, fid, conn, row) {
            Ok(role) => reply(world, conn, id, Response::ForestJoined(role)),
            Err(e) => {
                // The tree has no root and never will: the forest cannot finish, so it ends now
                // rather than at its deadline (its other rows get `forest_expired`).
                reply(world, conn, id, Response::Error(e));
                end(world, fid, Gone::Expired);
            }
        }
    } else if let Some(f) = world.resource_mut::<Forests>().live.get_mut(&fid) {
        f.waiting.push(Waiting { conn, id, row });
    }
}

fn same_task(a: &TaskSpec, b: &TaskSpec) -> bool {
    a.question == b.question
        && a.golden_answers == b.golden_answers
        && a.data_source == b.data_source
        && a.metric == b.metric
}

fn check_join(world: &World, j: &JoinForest) -> Option<Response> {
    let limits = &world.resource::<SimSettings>().limits;
    let s = j.shape;
    let invalid = |m: String| Some(forest_error(ErrorCode::InvalidForest, m));
    if j.key.is_empty() || j.key.chars().count() > MAX_KEY_CHARS {
        return invalid(format!("a forest key has 1 to {MAX_KEY_CHARS} characters"));
    }
    if s.m == 0 {
        return invalid("m = 0: a forest has at least one tree".into());
    }
    if u64::from(s.k) != 1 + u64::from(s.n) * u64::from(s.l) {
        return invalid(format!(
            "k = {} with n = {} and l = {}: every chain of a forest is a row, so k must be 1 + n l = {}",
            s.k,
            s.n,
            s.l,
            1 + u64::from(s.n) * u64::from(s.l)
        ));
    }
    if s.rows() > limits.max_forest_rows as u64 {
        return invalid(format!("{} rows (m k); the limit is {}", s.rows(), limits.max_forest_rows));
    }
    let forests = world.resource::<Forests>();
    match forests.gone.get(&j.key) {
        Some(Gone::Finished) => {
            return Some(forest_error(ErrorCode::ForestFull, format!("forest `{}` has finished", j.key)));
        }
        Some(Gone::Expired) => {
            return Some(forest_error(ErrorCode::ForestExpired, format!("forest `{}` expired", j.key)));
        }
        None => {}
    }
    None
}

fn start(world: &mut World, j: &JoinForest) -> Result<ForestId, ErrorInfo> {
    let limits = world.resource::<SimSettings>().limits.clone();
    let now = world.resource::<Now>().0;
    let mut forests = world.resource_mut::<Forests>();
    // Finished forests only wait to close their episodes; they do not count.
    if forests.live() >= limits.max_forests {
        return Err(ErrorInfo::new(
            ErrorCode::TooManyForests,
            format!("the server holds {} growing forests; the limit is {}", forests.live(), limits.max_forests),
        ));
    }
    forests.next += 1;
    let fid = forests.next;
    let trees = (0..j.shape.m).map(|_| Tree::default()).collect();
    forests.by_key.insert(j.key.clone(), fid);
    forests.live.insert(
        fid,
        Forest {
            join: j.clone(),
            deadline: now + Duration::from_secs(limits.forest_timeout_secs),
            joined: 0,
            trees,
            waiting: Vec::new(),
            prompt: String::new(),
            max_turns: 0,
            finished: false,
        },
    );
    Ok(fid)
}

/// Create tree `tree`'s root episode for `conn`.
fn play_root(world: &mut World, fid: ForestId, conn: ConnId, tree: u32) -> Result<ForestRole, ErrorInfo> {
    let (task, options) = {
        let f = &world.resource::<Forests>().live[&fid];
        (f.join.task.clone(), f.join.options.clone())
    };
    let created = create(world, Forest::owner(fid), CreateEpisodes { tasks: vec![task], options });
    let start =
        match created {
            Response::EpisodesCreated(c) => c.episodes.into_iter().next().unwrap_or_else(|| {
                Err(ErrorInfo::new(ErrorCode::Internal, "creating a forest root returned nothing"))
            })?,
            Response::Error(e) => return Err(e),
            _ => return Err(ErrorInfo::new(ErrorCode::Internal, "creating a forest root returned another reply")),
        };
    grant(world, start.episode, conn);
    let mut forests = world.resource_mut::<Forests>();
    let Some(f) = forests.live.get_mut(&fid) else {
        return Err(ErrorInfo::new(ErrorCode::Internal, "the forest vanished"));
    };
    f.prompt.clone_from(&start.prompt);
    f.max_turns = start.max_turns;
    let t = &mut f.trees[tree as usize];
    t.root = Some(start.episode);
    t.chains.push(Chain { episode: start.episode, from_step: 0, round: 0 });
    Ok(ForestRole {
        key: f.join.key.clone(),
        row: tree,
        tree,
        round: 0,
        episode: start.episode,
        prompt: start.prompt,
        max_turns: start.max_turns,
        from: None,
        prefix: Vec::new(),
    })
}

fn grant(world: &mut World, episode: EpisodeId, holder: ConnId) {
    if let Some(&entity) = world.resource::<Directory>().by_id.get(&episode) {
        world.entity_mut(entity).insert(ForestHold { holder });
    }
}

/// Where row `row` of a forest of `shape` goes: (round, tree, pick).
pub fn slot(shape: ForestShape, row: u32) -> (u32, u32, u32) {
    // Without picks every row is a root (a join checks `row < m k`, and `n l = 0` makes that m).
    if row < shape.m || shape.n == 0 {
        return (0, row, 0);
    }
    let s = row - shape.m;
    let per_round = shape.m.saturating_mul(shape.n);
    (1 + s / per_round, (s % per_round) / shape.n, s % shape.n)
}

/// The episode's completed steps and whether it is done; `None` when it is gone.
fn progress(world: &World, episode: EpisodeId) -> Option<(u32, bool)> {
    let entity = *world.resource::<Directory>().by_id.get(&episode)?;
    let history = world.get::<History>(entity)?;
    let phase = world.get::<Phase>(entity)?;
    Some((history.0.len(), *phase == Phase::Done))
}

/// The system: answer waiting rows whose trees are ready, finish complete forests, expire late
/// ones, forget old keys.
pub fn advance_forests(world: &mut World) {
    let now = world.resource::<Now>().0;
    let ids: Vec<ForestId> = world.resource::<Forests>().live.keys().copied().collect();
    for fid in ids {
        let (due, finished) =
            world.resource::<Forests>().live.get(&fid).map_or((false, false), |f| (now >= f.deadline, f.finished));
        if due {
            end(world, fid, if finished { Gone::Finished } else { Gone::Expired });
            continue;
        }
        if finished {
            continue;
        }
        serve_waiting(world, fid);
        if complete(world, fid) {
            finish(world, fid);
        }
    }
    let mut forests = world.resource_mut::<Forests>();
    while forests.gone_order.front().is_some_and(|(at, _)| now >= *at) {
        if let Some((_, key)) = forests.gone_order.pop_front() {
            forests.gone.remove(&key);
        }
    }
}

fn serve_waiting(world: &mut World, fid: ForestId) {
    let waiting = match world.resource_mut::<Forests>().live.get_mut(&fid) {
        Some(f) => std::mem::take(&mut f.waiting),
        None => return,
    };
    let mut still = Vec::new();
    let mut broken = false;
    for w in waiting {
        if broken {
            still.push(w);
            continue;
        }
        match try_expand(world, fid, w.conn, w.row) {
            Ok(None) => still.push(w),
            Ok(Some(role)) => reply(world, w.conn, w.id, Response::ForestJoined(role)),
            Err(e) => {
                // A chain this row needed is missing: the forest cannot finish.
                reply(world, w.conn, w.id, Response::Error(e));
                broken = true;
            }
        }
    }
    if let Some(f) = world.resource_mut::<Forests>().live.get_mut(&fid) {
        f.waiting = still;
    }
    if broken {
        end(world, fid, Gone::Expired);
    }
}

/// Hand row `row` its expansion if its tree's earlier rounds are done; `Ok(None)` if not yet.
fn try_expand(world: &mut World, fid: ForestId, conn: ConnId, row: u32) -> Result<Option<ForestRole>, ErrorInfo> {
    let (shape, seed, key) = {
        let f = &world.resource::<Forests>().live[&fid];
        (f.join.shape, f.join.seed, f.join.key.clone())
    };
    let (round, tree, pick) = slot(shape, row);
    let earlier: Vec<(EpisodeId, u32)> = world.resource::<Forests>().live[&fid].trees[tree as usize]
        .chains
        .iter()
        .filter(|c| c.round < round)
        .map(|c| (c.episode, c.from_step))
        .collect();
    // Rounds before `round` hold 1 + n (round - 1) chains once every row of them has joined.
    if (earlier.len() as u64) < 1 + u64::from(shape.n) * u64::from(round - 1) {
        return Ok(None);
    }
    let mut lens = Vec::with_capacity(earlier.len());
    for &(episode, _) in &earlier {
        match progress(world, episode) {
            None => {
                return Err(ErrorInfo::new(
                    ErrorCode::ForestExpired,
                    format!("forest `{key}`: episode {episode} of tree {tree} is gone"),
                ));
            }
            Some((_, false)) => return Ok(None),
            Some((len, true)) => lens.push(len),
        }
    }
    let drawn = world.resource::<Forests>().live[&fid].trees[tree as usize].picks.get(&round).cloned();
    let picks = match drawn {
        Some(p) => p,
        None => {
            let root = world.resource::<Forests>().live[&fid].trees[tree as usize].root;
            let Some(root) = root else {
                return Err(ErrorInfo::new(ErrorCode::Internal, "a tree with chains has no root"));
            };
            // The root, then every non-leaf step each earlier chain added (its last step is its leaf).
            let mut candidates = vec![ForestNode { episode: root, step: 0 }];
            for (&(episode, from), &len) in earlier.iter().zip(&lens) {
                candidates.extend((from + 1..len).map(|step| ForestNode { episode, step }));
            }
            let mut rng = ChaCha8Rng::seed_from_u64(pick_seed(seed, tree, round));
            let p: Vec<ForestNode> = (0..shape.n).map(|_| candidates[rng.random_range(0..candidates.len())]).collect();
            if let Some(f) = world.resource_mut::<Forests>().live.get_mut(&fid) {
                f.trees[tree as usize].picks.insert(round, p.clone());
            }
            p
        }
    };
    let node = picks[pick as usize];
    let now = world.resource::<Now>().0;
    let forked =
        fork_one(world, Forest::owner(fid), &ForkSpec { episode: node.episode, at_step: node.step, n: 1 }, now)?;
    let Some(&child) = forked.children.first() else {
        return Err(ErrorInfo::new(ErrorCode::Internal, "a forest fork made no child"));
    };
    grant(world, child, conn);
    let prefix = prefix_of(world, node);
    let mut forests = world.resource_mut::<Forests>();
    let Some(f) = forests.live.get_mut(&fid) else {
        return Err(ErrorInfo::new(ErrorCode::Internal, "the forest vanished"));
    };
    f.trees[tree as usize].chains.push(Chain { episode: child, from_step: node.step, round });
    Ok(Some(ForestRole {
        key,
        row,
        tree,
        round,
        episode: child,
        prompt: f.prompt.clone(),
        max_turns: f.max_turns,
        from: Some(node),
        prefix,
    }))
}

/// A seed per (forest seed, tree, round), so picks do not depend on which row asks first.
fn pick_seed(seed: u64, tree: u32, round: u32) -> u64 {
    let mix = (u64::from(tree) << 32 | u64::from(round)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    seed ^ mix.rotate_left(17)
}

fn prefix_of(world: &World, node: ForestNode) -> Vec<PrefixStep> {
    let Some(&entity) = world.resource::<Directory>().by_id.get(&node.episode) else { return Vec::new() };
    let Some(history) = world.get::<History>(entity) else { return Vec::new() };
    history
        .0
        .steps()
        .into_iter()
        .take(node.step as usize)
        .map(|s| PrefixStep { action: s.action.clone(), observation: s.observation.clone(), data: s.data.clone() })
        .collect()
}

/// Every row joined and every chain finished.
fn complete(world: &World, fid: ForestId) -> bool {
    let Some(f) = world.resource::<Forests>().live.get(&fid) else { return false };
    let chains: u64 = f.trees.iter().map(|t| t.chains.len() as u64).sum();
    if u64::from(f.joined) < f.join.shape.rows() || chains < f.join.shape.rows() || !f.waiting.is_empty() {
        return false;
    }
    f.episodes().all(|e| progress(world, e).is_none_or(|(_, done)| done))
}

/// Every row played: count it, refuse later rows, keep the episodes readable until the deadline.
fn finish(world: &mut World, fid: ForestId) {
    let mut forests = world.resource_mut::<Forests>();
    let Some(f) = forests.live.get_mut(&fid) else { return };
    f.finished = true;
    let key = f.join.key.clone();
    forests.finished += 1;
    forests.gone.insert(key, Gone::Finished);
}

/// Close the forest's episodes, answer its waiting rows, and remember its key for a while.
fn end(world: &mut World, fid: ForestId, why: Gone) {
    let timeout = Duration::from_secs(world.resource::<SimSettings>().limits.forest_timeout_secs);
    let now = world.resource::<Now>().0;
    let Some(f) = world.resource_mut::<Forests>().live.remove(&fid) else { return };
    for w in &f.waiting {
        let msg = format!("forest `{}` expired before this row's node was ready", f.join.key);
        reply(world, w.conn, w.id, forest_error(ErrorCode::ForestExpired, msg));
    }
    for episode in f.episodes() {
        if let Some(&entity) = world.resource::<Directory>().by_id.get(&episode) {
            remove(world, episode, entity);
            world.resource_mut::<Counters>().closed += 1;
        }
    }
    // The pseudo-owner's count went to zero with its last episode.
    world.resource_mut::<Directory>().per_conn.remove(&Forest::owner(fid));
    let mut forests = world.resource_mut::<Forests>();
    forests.by_key.remove(&f.join.key);
    if why == Gone::Expired {
        forests.expired += 1;
    }
    forests.gone.insert(f.join.key.clone(), why);
    forests.gone_order.push_back((now + timeout, f.join.key));
}

/// A session ended for good. A growing forest that waited for one of its rows, or whose chain it
/// was playing and had not finished, can no longer finish: it ends now (its other rows get
/// `forest_expired`) instead of at its deadline. Finished chains stay, for later rounds to fork.
pub fn forget_conn(world: &mut World, conn: ConnId) {
    let mut broken = Vec::new();
    let ids: Vec<ForestId> = world.resource::<Forests>().live.keys().copied().collect();
    for fid in ids {
        let Some(f) = world.resource::<Forests>().live.get(&fid) else { continue };
        if f.finished {
            continue;
        }
        let waited = f.waiting.iter().any(|w| w.conn == conn);
        let playing = f.episodes().any(|e| {
            let dir = world.resource::<Directory>();
            dir.by_id.get(&e).is_some_and(|&entity| {
                world.get::<ForestHold>(entity).is_some_and(|h| h.holder == conn)
                    && world.get::<Phase>(entity).is_some_and(|p| *p != Phase::Done)
            })
        });
        if waited || playing {
            broken.push(fid);
        }
    }
    for fid in broken {
        if let Some(f) = world.resource_mut::<Forests>().live.get_mut(&fid) {
            f.waiting.retain(|w| w.conn != conn);
        }
        end(world, fid, Gone::Expired);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_map_to_rounds_trees_and_picks_in_join_order() {
        let s = ForestShape { m: 2, n: 2, l: 1, k: 3 };
        let slots: Vec<_> = (0..6).map(|r| slot(s, r)).collect();
        assert_eq!(slots, [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]);
        let s = ForestShape { m: 1, n: 2, l: 2, k: 5 };
        let slots: Vec<_> = (0..5).map(|r| slot(s, r)).collect();
        assert_eq!(slots, [(0, 0, 0), (1, 0, 0), (1, 0, 1), (2, 0, 0), (2, 0, 1)]);
        let chains = ForestShape { m: 4, n: 0, l: 0, k: 1 };
        assert!((0..4).all(|r| slot(chains, r) == (0, r, 0)));
    }

    #[test]
    fn pick_seeds_differ_by_tree_and_round() {
        let seeds = [pick_seed(7, 0, 1), pick_seed(7, 1, 1), pick_seed(7, 0, 2), pick_seed(8, 0, 1)];
        for (i, a) in seeds.iter().enumerate() {
            for b in &seeds[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
