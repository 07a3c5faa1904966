// Grove view: rollout trees, transcripts and training curves of a run (or of an experiment's
// arms), drawn in SVG from the server's JSON API. No library, nothing fetched from elsewhere.
// Every text from the run is put into the page as text, never as markup.
'use strict';

(() => {
  const POLL_MS = 3000;
  const SVGNS = 'http://www.w3.org/2000/svg';
  const PALETTE = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#ca8a04', '#db2777',
    '#4b5563', '#65a30d'];
  const GREY = '#9ca3af';
  const RUN_SERIES = [
    ['reward_mean', 'training reward (mean of trained rows)'],
    ['metric_mean', 'EM / F1 of trained rows (mean)'],
    ['kl', 'KL to the reference'],
    ['entropy', 'entropy'],
    ['clip_fraction', 'clip fraction'],
    ['tool_calls', 'tool calls per step'],
  ];
  // Tree layout (left to right): column per depth, row per leaf.
  const COL = 175;
  const ROW = 30;
  const TOP = 28;
  const LEFT = 14;
  const TREE_GAP = 18;
  const LABEL_ROOM = 230;
  // Characters of an inner node's label that fit before the next column (11px monospace).
  const INNER_CHARS = 22;

  const $ = (sel) => document.querySelector(sel);

  // ---------------------------------------------------------------- DOM helpers

  function setAttrs(e, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'text') e.textContent = String(v);
      else if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
  }

  function append(e, kids) {
    for (const k of kids.flat()) {
      if (k === null || k === undefined || k === false) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
  }

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    setAttrs(e, attrs);
    append(e, kids);
    return e;
  }

  function svg(tag, attrs, ...kids) {
    const e = document.createElementNS(SVGNS, tag);
    setAttrs(e, attrs);
    append(e, kids);
    return e;
  }

  const finite = (x) => typeof x === 'number' && Number.isFinite(x);

  function fmt(x, digits = 3) {
    if (!finite(x)) return '—';
    if (Number.isInteger(x)) return String(x);
    if (Math.abs(x) >= 1000) return x.toFixed(0);
    if (Math.abs(x) >= 100) return x.toFixed(1);
    return x.toFixed(digits);
  }

  function trunc(s, n) {
    s = String(s ?? '').replace(/\s+/g, ' ').trim();
    return s.length > n ? s.slice(0, n - 1) + '…' : s;
  }

  const clamp = (x, lo, hi) => Math.min(hi, Math.max(lo, x));

  function hexRgb(h) {
    const n = parseInt(h.slice(1), 16);
    return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  }

  function mix(a, b, t) {
    const [x, y] = [hexRgb(a), hexRgb(b)];
    const c = x.map((v, i) => Math.round(v + (y[i] - v) * t));
    return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
  }

  // ---------------------------------------------------------------- state

  const state = {
    kind: null,
    run: null,
    runs: [],
    label: '',
    path: '',
    steps: [],
    metrics: [],
    evals: [],
    warnings: [],
    step: null, // the step wanted
    follow: true, // follow the newest step
    loadedStep: null,
    loadingStep: null,
    prompts: [],
    promptIdx: null,
    sel: null, // {tree, node}
    colorMode: 'reward',
    rewardDomain: [0, 1],
    filters: { reward: 'all', hops: 'all', source: 'all' },
    tab: 'trees',
    exp: null,
    expKey: '',
    curvesKey: '',
    showSweep: false,
    error: null,
    shown: false, // a step (or the lack of one) has been rendered
  };

  function readHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    if (h.has('run')) state.run = Number(h.get('run'));
    if (h.has('step')) {
      state.step = Number(h.get('step'));
      state.follow = false;
    }
    if (h.has('prompt')) state.promptIdx = Number(h.get('prompt'));
    if (h.has('tree') && h.has('node')) state.sel = { tree: Number(h.get('tree')), node: Number(h.get('node')) };
    if (h.get('tab') === 'curves') state.tab = 'curves';
    if (h.get('color') === 'advantage') state.colorMode = 'advantage';
  }

  function writeHash() {
    const h = new URLSearchParams();
    if (state.kind === 'experiment' && state.run !== null) h.set('run', state.run);
    if (!state.follow && state.step !== null) h.set('step', state.step);
    if (state.promptIdx !== null) h.set('prompt', state.promptIdx);
    if (state.sel) {
      h.set('tree', state.sel.tree);
      h.set('node', state.sel.node);
    }
    if (state.tab !== 'trees') h.set('tab', state.tab);
    if (state.colorMode !== 'reward') h.set('color', state.colorMode);
    history.replaceState(null, '', '#' + h.toString());
  }

  // ---------------------------------------------------------------- server

  async function getJSON(url) {
    const r = await fetch(url, { cache: 'no-store' });
    const body = await r.json().catch(() => null);
    if (!r.ok) {
      const e = new Error((body && body.error) || `HTTP ${r.status}`);
      e.status = r.status;
      throw e;
    }
    return body;
  }

  let polling = false;
  let again = false;

  async function poll() {
    if (polling) {
      again = true; // asked for while a poll is out: poll once more when it is back
      return;
    }
    polling = true;
    const asked = state.run;
    try {
      const q = asked === null ? '' : `?run=${encodeURIComponent(asked)}`;
      const r = await getJSON('/api/run' + q);
      if (state.run !== asked) return; // another run was picked meanwhile
      if (r.kind === 'experiment') {
        const ex = await getJSON('/api/experiment');
        const key = JSON.stringify(ex);
        if (key !== state.expKey) {
          state.expKey = key;
          state.exp = ex;
          state.curvesKey = '';
        }
      }
      state.error = null;
      applyRun(r);
    } catch (e) {
      if (e.status === 404 && state.run !== null) {
        state.run = null; // a run named by an old link: show the folder's first
        state.error = null;
      } else {
        state.error = `cannot read the run: ${e.message} (trying again)`;
      }
    } finally {
      polling = false;
      renderStatus();
      if (again) {
        again = false;
        setTimeout(poll, 0);
      }
    }
  }

  function applyRun(r) {
    state.kind = r.kind;
    state.runs = r.runs || [];
    if (r.run !== state.run) {
      state.loadedStep = null;
      state.curvesKey = '';
    }
    state.run = r.run;
    state.label = r.label || '';
    state.path = r.path || '';
    state.warnings = r.warnings || [];
    const stepsChanged = JSON.stringify(r.steps) !== JSON.stringify(state.steps);
    state.steps = r.steps || [];
    state.metrics = r.metrics || [];
    state.evals = r.evals || [];
    renderHeader();
    if (stepsChanged) renderStepPicker();
    const last = state.metrics[state.metrics.length - 1];
    const key = JSON.stringify([r.run, state.metrics.length, last, state.evals.map((e) => e.step), state.expKey.length,
      state.showSweep]);
    if (key !== state.curvesKey) {
      state.curvesKey = key;
      renderCurves();
    }
    let want = state.step;
    if (state.follow || want === null || !state.steps.includes(want)) {
      if (want !== null && !state.steps.includes(want)) state.follow = true;
      want = state.steps.length ? state.steps[state.steps.length - 1] : null;
    }
    if ((want !== state.loadedStep || !state.shown) && want !== state.loadingStep) loadStep(want);
    else syncStepPicker();
  }

  async function loadStep(step) {
    state.step = step;
    state.loadingStep = step;
    syncStepPicker();
    if (step === null) {
      state.prompts = [];
      state.loadedStep = null;
      state.loadingStep = null;
      afterStepLoaded();
      return;
    }
    const run = state.run;
    try {
      const t = await getJSON(`/api/trees?step=${step}&run=${run}`);
      if (state.loadingStep !== step || state.run !== run) return; // another step or run was asked for meanwhile
      state.prompts = t.prompts || [];
      state.loadedStep = step;
    } catch (e) {
      if (state.loadingStep === step) {
        state.error = `step ${step}: ${e.message}`;
        renderStatus();
      }
    } finally {
      if (state.loadingStep === step) state.loadingStep = null;
    }
    if (state.loadedStep === step) afterStepLoaded();
  }

  function afterStepLoaded() {
    state.shown = true;
    const rewards = state.prompts.flatMap((p) => leavesOf(p).map((l) => l.reward)).filter(finite);
    state.rewardDomain = [Math.min(0, ...rewards), Math.max(1, ...rewards)];
    renderFilters();
    const visible = visiblePrompts();
    if (!state.prompts.some((p) => p.prompt === state.promptIdx)) {
      state.promptIdx = visible.length ? visible[0].prompt : null;
      state.sel = null;
    }
    renderPrompts();
    renderTrees();
    writeHash();
  }

  // ---------------------------------------------------------------- header and status

  function renderHeader() {
    $('#kind').textContent = state.kind || '';
    $('#run-label').textContent = state.kind === 'experiment' ? state.path : state.label;
    $('#run-label').title = state.path;
    const picker = $('#run-picker');
    $('#run-picker-label').hidden = state.kind !== 'experiment';
    const want = JSON.stringify(state.runs);
    if (picker.dataset.runs !== want) {
      picker.dataset.runs = want;
      picker.replaceChildren(...state.runs.map((r) => el('option', { value: r.run, text: r.label })));
    }
    if (state.run !== null) picker.value = String(state.run);
  }

  function renderStatus() {
    const live = $('#live');
    const n = state.steps.length;
    live.textContent = `${n} step${n === 1 ? '' : 's'} with trees · ${state.metrics.length} trained · updated ` +
      new Date().toLocaleTimeString();
    live.classList.toggle('stale', state.error !== null);
    const banner = $('#banner');
    const lines = [state.error, ...state.warnings].filter(Boolean);
    banner.hidden = lines.length === 0;
    banner.replaceChildren(...lines.map((l) => el('div', { text: l })));
  }

  // ---------------------------------------------------------------- steps and prompts

  function renderStepPicker() {
    const picker = $('#step-picker');
    if (!state.steps.length) {
      picker.replaceChildren(el('option', { value: '', text: 'no trees yet', disabled: true }));
      return;
    }
    const newest = state.steps[state.steps.length - 1];
    const opts = [el('option', { value: 'latest', text: `latest (step ${newest})` })];
    for (const s of [...state.steps].reverse()) opts.push(el('option', { value: s, text: `step ${s}` }));
    picker.replaceChildren(...opts);
    syncStepPicker();
  }

  function syncStepPicker() {
    const picker = $('#step-picker');
    if (!state.steps.length) return;
    picker.value = state.follow ? 'latest' : String(state.step);
  }

  function leavesOf(p) {
    return p.trees.flatMap((t) => t.nodes).filter((n) => n.leaf).map((n) => n.leaf);
  }

  function passes(p) {
    const f = state.filters;
    const s = p.summary || {};
    if (f.source !== 'all' && p.data_source !== f.source) return false;
    if (f.hops !== 'all') {
      const h = s.hops === null || s.hops === undefined ? 'unknown' : String(s.hops);
      if (h !== f.hops) return false;
    }
    if (f.reward !== 'all') {
      const r = leavesOf(p).map((l) => l.reward).filter(finite);
      const best = r.length ? Math.max(...r) : null;
      const same = r.every((x) => x === r[0]);
      if (f.reward === 'solved' && !(best > 0)) return false;
      if (f.reward === 'unsolved' && best > 0) return false;
      if (f.reward === 'mixed' && same) return false;
      if (f.reward === 'uniform' && !same) return false;
    }
    return true;
  }

  function visiblePrompts() {
    return state.prompts.filter(passes);
  }

  function fillSelect(sel, values, current) {
    const opts = [el('option', { value: 'all', text: 'any' }), ...values.map(([v, t]) => el('option', { value: v, text: t }))];
    sel.replaceChildren(...opts);
    sel.value = values.some(([v]) => v === current) ? current : 'all';
    return sel.value;
  }

  function renderFilters() {
    const hops = [...new Set(state.prompts.map((p) => {
      const h = p.summary && p.summary.hops;
      return h === null || h === undefined ? 'unknown' : String(h);
    }))].sort();
    state.filters.hops = fillSelect($('#filter-hops'), hops.map((h) => [h, h === 'unknown' ? 'not said' : `${h} hops`]),
      state.filters.hops);
    const sources = [...new Set(state.prompts.map((p) => p.data_source))].sort();
    state.filters.source = fillSelect($('#filter-source'), sources.map((s) => [s, s]), state.filters.source);
    $('#filter-reward').value = state.filters.reward;
  }

  function renderPrompts() {
    const list = $('#prompt-list');
    const visible = visiblePrompts();
    $('#prompt-count').textContent = state.loadedStep === null ? '' :
      `${visible.length} of ${state.prompts.length} prompts of step ${state.loadedStep}`;
    list.replaceChildren(...visible.map((p) => {
      const s = p.summary || {};
      const pill = el('span', { class: 'pill', text: finite(s.reward_max) ? fmt(s.reward_max, 2) : '—' });
      pill.style.background = rewardColor(s.reward_max);
      pill.title = `best leaf reward ${fmt(s.reward_max)}, mean ${fmt(s.reward_mean)}`;
      const meta = [p.data_source, finite(s.hops) ? `${s.hops} hops` : null, `${s.leaves} leaves`,
        s.branch_points ? `${s.branch_points} branch points` : null].filter(Boolean).join(' · ');
      return el('li', {
        class: 'prompt' + (p.prompt === state.promptIdx ? ' selected' : ''),
        'data-prompt': p.prompt,
        onclick: () => selectPrompt(p.prompt),
      }, pill, el('span', { class: 'q', text: trunc(p.question, 140) }), el('span', { class: 'meta', text: meta }));
    }));
    if (!state.steps.length) {
      list.replaceChildren(el('li', { class: 'empty', text: 'No trees recorded yet: the trainer writes ' +
        'trees-<step>.jsonl.gz into the run folder; this page looks again every few seconds.' }));
    }
  }

  function selectPrompt(idx) {
    state.promptIdx = idx;
    state.sel = null;
    for (const li of document.querySelectorAll('#prompt-list li.prompt')) {
      li.classList.toggle('selected', Number(li.dataset.prompt) === idx);
    }
    renderTrees();
    writeHash();
  }

  const currentPrompt = () => state.prompts.find((p) => p.prompt === state.promptIdx) || null;

  // ---------------------------------------------------------------- trees

  function rewardColor(v) {
    if (!finite(v)) return GREY;
    const [lo, hi] = state.rewardDomain;
    const t = clamp((v - lo) / (hi - lo || 1), 0, 1);
    return `hsl(${Math.round(t * 120)}, 68%, 42%)`;
  }

  function advantageColor(v, max) {
    if (!finite(v)) return GREY;
    const t = clamp(v / (max || 1), -1, 1);
    return t >= 0 ? mix('#e5e7eb', '#15803d', t) : mix('#e5e7eb', '#b91c1c', -t);
  }

  // Per node: the best reward of the leaves below it, and the mean advantage of the kept leaves
  // below it (a row's advantage applies to every token of its trajectory).
  function nodeValues(nodes) {
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const best = new Map();
    const adv = new Map();
    const seen = new Set();
    const visit = (n) => {
      if (seen.has(n.id)) return;
      seen.add(n.id);
      let b = n.leaf && finite(n.leaf.reward) ? n.leaf.reward : null;
      const a = n.leaf && finite(n.leaf.advantage) ? [n.leaf.advantage] : [];
      for (const c of n.children) {
        const k = byId.get(c);
        if (!k) continue;
        visit(k);
        const kb = best.get(k.id);
        if (kb !== null && kb !== undefined) b = b === null ? kb : Math.max(b, kb);
        a.push(...(adv.get(k.id) || []));
      }
      best.set(n.id, b);
      adv.set(n.id, a);
    };
    nodes.forEach(visit);
    const mean = new Map([...adv].map(([id, xs]) => [id, xs.length ? xs.reduce((s, x) => s + x, 0) / xs.length : null]));
    return { best, adv: mean };
  }

  function layout(nodes) {
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const root = nodes.find((n) => n.parent === undefined || n.parent === null) || nodes[0];
    const pos = new Map();
    let slot = 0;
    let maxDepth = 0;
    const visit = (n, depth) => {
      if (pos.has(n.id)) return;
      pos.set(n.id, null);
      maxDepth = Math.max(maxDepth, depth);
      const kids = n.children.map((c) => byId.get(c)).filter((k) => k && !pos.has(k.id));
      if (!kids.length) {
        pos.set(n.id, { depth, slot: slot++ });
        return;
      }
      kids.forEach((k) => visit(k, depth + 1));
      const ys = kids.map((k) => pos.get(k.id)).filter(Boolean).map((p) => p.slot);
      pos.set(n.id, { depth, slot: ys.length ? (Math.min(...ys) + Math.max(...ys)) / 2 : slot++ });
    };
    if (root) visit(root, 0);
    // Nodes not reachable from the root (a broken record) still show, below.
    for (const n of nodes) if (!pos.has(n.id)) visit(n, 0);
    const xy = (id) => {
      const p = pos.get(id);
      return p ? [LEFT + p.depth * COL, TOP + p.slot * ROW + ROW / 2] : [LEFT, TOP];
    };
    return { xy, height: TOP + Math.max(slot, 1) * ROW, width: LEFT + maxDepth * COL + LABEL_ROOM };
  }

  // A leaf's row is its own, so its label may run on; an inner node's must end before the
  // next column.
  function nodeLabel(n) {
    if (n.parent === undefined || n.parent === null) return 'prompt';
    const kind = n.kind || 'turn';
    if (n.leaf) {
      const mark = n.failure ? ' ✕ refused' : n.tool_error ? ' ⚠' : '';
      return `${kind}${n.content ? ` “${trunc(n.content, 40)}”` : ''}${mark}  r=${fmt(n.leaf.reward, 2)}`;
    }
    const mark = n.failure ? ' ✕' : n.tool_error ? ' ⚠' : '';
    const room = Math.max(INNER_CHARS - kind.length - mark.length - 3, 4);
    return `${kind}${n.content ? ` “${trunc(n.content, room)}”` : ''}${mark}`;
  }

  function renderLegend(maxAdv) {
    const legend = $('#legend');
    const stops = state.colorMode === 'reward'
      ? [0, 0.25, 0.5, 0.75, 1].map((t) => {
        const [lo, hi] = state.rewardDomain;
        return rewardColor(lo + t * (hi - lo));
      })
      : [-1, -0.5, 0, 0.5, 1].map((t) => advantageColor(t * maxAdv, maxAdv));
    const lo = state.colorMode === 'reward' ? fmt(state.rewardDomain[0], 1) : fmt(-maxAdv, 2);
    const hi = state.colorMode === 'reward' ? fmt(state.rewardDomain[1], 1) : fmt(maxAdv, 2);
    const swatches = stops.map((c) => {
      const s = el('span', { class: 'swatch' });
      s.style.background = c;
      return s;
    });
    const grey = el('span', { class: 'swatch' });
    grey.style.background = GREY;
    legend.replaceChildren(lo, ...swatches, hi, ' ', grey,
      state.colorMode === 'reward' ? ' no leaf' : ' not trained', el('span', { class: 'key-branch', text: '◎ branch point' }),
      el('span', { class: 'key-fork', text: '┄ forked episode' }));
  }

  function renderPromptHead(p) {
    const head = $('#prompt-head');
    if (!p) {
      head.replaceChildren();
      delete head.dataset.prompt;
      return;
    }
    head.dataset.prompt = p.prompt;
    head.replaceChildren(
      el('div', { class: 'question', text: p.question }),
      el('div', { class: 'meta' },
        `gold: ${p.golden_answers.join(' | ')} · ${p.data_source} · ${p.method} · estimator ${p.estimator}` +
        ` · prompt ${p.prompt} of step ${p.step}` + (p.task_id ? ` · task ${p.task_id}` : '')),
    );
  }

  function renderTrees() {
    const box = $('#trees');
    const p = currentPrompt();
    renderPromptHead(p);
    if (!p) {
      box.replaceChildren(el('p', { class: 'empty', text: state.prompts.length ? 'No prompt matches the filters.' : '' }));
      delete box.dataset.step;
      delete box.dataset.prompt;
      renderTranscript();
      return;
    }
    let maxAdv = 0;
    for (const l of leavesOf(p)) if (finite(l.advantage)) maxAdv = Math.max(maxAdv, Math.abs(l.advantage));
    renderLegend(maxAdv || 1);
    const root = svg('svg', { class: 'trees-svg', role: 'img', 'aria-label': 'rollout trees' });
    let y0 = 0;
    let width = 0;
    p.trees.forEach((tree, ti) => {
      const lay = layout(tree.nodes);
      const vals = nodeValues(tree.nodes);
      const byId = new Map(tree.nodes.map((n) => [n.id, n]));
      const g = svg('g', { class: 'tree', 'data-tree': ti, transform: `translate(0, ${y0})` });
      const leaves = tree.nodes.filter((n) => n.leaf).length;
      const branches = tree.nodes.filter((n) => n.children.length > 1).length;
      g.append(svg('text', { class: 'tree-title', x: LEFT - 6, y: 14,
        text: `tree ${ti + 1} (group ${tree.group}) · ${leaves} leaves · ${branches} branch points` }));
      for (const n of tree.nodes) {
        for (const c of n.children) {
          const k = byId.get(c);
          if (!k) continue;
          const [x1, y1] = lay.xy(n.id);
          const [x2, y2] = lay.xy(k.id);
          const mx = (x1 + x2) / 2;
          const forked = n.parent !== undefined && n.parent !== null && k.episode !== n.episode;
          g.append(svg('path', { class: 'edge' + (forked ? ' fork' : ''), d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }));
        }
      }
      for (const n of tree.nodes) {
        const [x, y] = lay.xy(n.id);
        const isRoot = n.parent === undefined || n.parent === null;
        const cls = ['node', isRoot ? 'root' : null, n.leaf ? 'leaf' : (n.children.length ? 'inner' : 'end'),
          n.children.length > 1 ? 'branch' : null, n.failure ? 'failed' : null, n.leaf && !n.leaf.kept ? 'unkept' : null]
          .filter(Boolean).join(' ');
        const color = state.colorMode === 'reward' ? rewardColor(vals.best.get(n.id))
          : advantageColor(vals.adv.get(n.id), maxAdv || 1);
        const tip = [`node ${n.id} · depth ${n.depth}`, n.kind, n.content ? `“${trunc(n.content, 80)}”` : null,
          `best reward below ${fmt(vals.best.get(n.id))}`, `advantage ${fmt(vals.adv.get(n.id))}`,
          finite(n.episode) ? `episode ${n.episode}, env step ${n.env_step}` : null].filter(Boolean).join('\n');
        const ng = svg('g', {
          class: cls, 'data-node-id': n.id, 'data-tree': ti, transform: `translate(${x}, ${y})`, tabindex: 0,
          onclick: () => selectNode(ti, n.id),
          onkeydown: (ev) => { if (ev.key === 'Enter') selectNode(ti, n.id); },
        }, svg('title', { text: tip }));
        if (n.children.length > 1) ng.append(svg('circle', { class: 'ring', r: 11 }));
        ng.append(svg('circle', { class: 'dot', r: isRoot ? 8 : 7, fill: color }));
        ng.append(svg('text', { class: 'label', x: 13, y: 4, text: nodeLabel(n) }));
        g.append(ng);
      }
      root.append(g);
      y0 += lay.height + TREE_GAP;
      width = Math.max(width, lay.width);
    });
    root.setAttribute('width', width);
    root.setAttribute('height', Math.max(y0, 40));
    root.setAttribute('viewBox', `0 0 ${width} ${Math.max(y0, 40)}`);
    box.replaceChildren(root);
    box.dataset.step = p.step;
    box.dataset.prompt = p.prompt;
    if (state.sel && !(p.trees[state.sel.tree] && p.trees[state.sel.tree].nodes.some((n) => n.id === state.sel.node))) {
      state.sel = null;
    }
    markSelected();
    renderTranscript();
  }

  function selectNode(tree, node) {
    state.sel = { tree, node };
    markSelected();
    renderTranscript();
    writeHash();
  }

  function markSelected() {
    for (const n of document.querySelectorAll('#trees g.node')) {
      n.classList.toggle('selected', !!state.sel && Number(n.dataset.tree) === state.sel.tree &&
        Number(n.dataset.nodeId) === state.sel.node);
    }
  }

  // ---------------------------------------------------------------- transcript

  function kv(rows) {
    return el('table', { class: 'kv' }, rows.filter(Boolean).map(([k, v]) =>
      el('tr', {}, el('th', { text: k }), el('td', { text: v }))));
  }

  function renderTranscript() {
    const box = $('#transcript');
    const p = currentPrompt();
    if (!p || !state.sel || !p.trees[state.sel.tree]) {
      box.replaceChildren(el('p', { class: 'hint', text: 'Click a node to read the transcript up to it.' }));
      delete box.dataset.node;
      return;
    }
    const tree = p.trees[state.sel.tree];
    const byId = new Map(tree.nodes.map((n) => [n.id, n]));
    const path = [];
    const seen = new Set();
    for (let n = byId.get(state.sel.node); n && !seen.has(n.id); n = byId.get(n.parent)) {
      seen.add(n.id);
      path.unshift(n);
    }
    const target = path[path.length - 1];
    const parts = [
      el('h2', { text: `tree ${state.sel.tree + 1}, node ${target.id} (depth ${target.depth})` }),
      el('section', { class: 'turn prompt' },
        el('h3', { text: `prompt · ${p.prompt_tokens} tokens` }),
        el('pre', { text: p.prompt_text }),
        el('p', { class: 'meta', text: `gold: ${p.golden_answers.join(' | ')}` })),
    ];
    for (const n of path) {
      if (n.parent === undefined || n.parent === null) continue;
      const head = [`turn ${n.depth}`, n.kind || 'turn', `${n.tokens} tokens`,
        finite(n.episode) ? `episode ${n.episode} · env step ${n.env_step}` : null].filter(Boolean).join(' · ');
      const obsHead = `observation · ${n.observation_tokens} tokens` + (n.observation_truncated ? ' · truncated' : '');
      parts.push(el('section', { class: 'turn', 'data-turn-node': n.id },
        el('h3', { text: head }),
        el('div', { class: 'label-small', text: 'action' }),
        el('pre', { class: 'action', text: n.action }),
        n.content ? el('div', { class: 'call' }, el('b', { text: n.kind === 'answer' ? 'answer ' : `${n.kind || 'call'} ` }),
          el('span', { text: n.content })) : null,
        n.tool_error ? el('div', { class: 'warn', text: `tool error: ${n.tool_error}` }) : null,
        n.failure ? el('div', { class: 'warn', text: `refused by the env-server: ${n.failure} (trajectory ends)` }) : null,
        n.observation ? el('div', { class: 'label-small', text: obsHead }) : null,
        n.observation ? el('pre', { class: 'observation', text: n.observation }) : null));
    }
    if (target.leaf) {
      const l = target.leaf;
      parts.push(el('section', { class: 'turn leaf-info' },
        el('h3', { text: 'leaf' }),
        kv([
          ['reward', fmt(l.reward)],
          ['metric (EM / F1)', fmt(l.metric)],
          l.format_valid !== undefined && l.format_valid !== null ? ['format valid', String(l.format_valid)] : null,
          l.answer !== undefined && l.answer !== null ? ['answer', l.answer] : null,
          ['kept for training', l.kept ? 'yes' : 'no'],
          ['advantage', fmt(l.advantage)],
          ['  inter-tree part', fmt(l.advantage_inter)],
          ['  intra-tree part', fmt(l.advantage_intra)],
        ])));
    } else {
      const below = [];
      const walk = (n) => {
        if (!n) return;
        if (n.leaf) below.push(n.leaf);
        n.children.forEach((c) => walk(byId.get(c)));
      };
      walk(target);
      const r = below.map((l) => l.reward).filter(finite);
      parts.push(el('section', { class: 'turn below' }, el('h3', { text: 'below this node' }), kv([
        ['leaves', String(below.length)],
        ['best reward', r.length ? fmt(Math.max(...r)) : '—'],
        ['mean reward', r.length ? fmt(r.reduce((s, x) => s + x, 0) / r.length) : '—'],
        ['children', String(target.children.length)],
      ])));
    }
    box.replaceChildren(...parts);
    box.dataset.node = target.id;
    box.scrollTop = box.scrollHeight;
  }

  // ---------------------------------------------------------------- curves

  // Ticks at 1, 2 or 5 times a power of ten, each with the decimals its spacing needs.
  function niceTicks(lo, hi, n) {
    const span = hi - lo;
    if (!(span > 0) || !Number.isFinite(span)) return [{ v: lo, text: fmt(lo) }];
    const raw = span / n;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const e = raw / mag;
    const step = (e >= 7.5 ? 10 : e >= 3.5 ? 5 : e >= 1.5 ? 2 : 1) * mag;
    const digits = clamp(-Math.floor(Math.log10(step) + 1e-9), 0, 12);
    const out = [];
    for (let i = Math.ceil(lo / step); i * step <= hi + step * 1e-9 && out.length < 50; i++) {
      const v = Number((i * step).toFixed(12));
      out.push({ v, text: v.toFixed(digits) });
    }
    return out;
  }

  function showTip(ev, rows) {
    const tip = $('#tooltip');
    tip.replaceChildren(...rows.map((r) => {
      const line = el('div', {}, r.color ? el('span', { class: 'swatch' }) : null, r.text);
      if (r.color) line.firstChild.style.background = r.color;
      return line;
    }));
    tip.hidden = false;
    const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = `${Math.max(4, x)}px`;
    tip.style.top = `${ev.clientY + 14}px`;
  }

  function hideTip() {
    $('#tooltip').hidden = true;
  }

  // One plot: series of {label, color, points: [{x, y, lo, hi, n}]}; hovering shows the values at
  // the nearest step.
  function plot({ key, title, series }) {
    const W = 420;
    const H = 210;
    const M = { l: 54, r: 14, t: 10, b: 30 };
    const fig = el('figure', { class: 'plot', 'data-metric': key }, el('figcaption', { text: title }));
    series = series.map((s, i) => ({ ...s, color: s.color || PALETTE[i % PALETTE.length],
      points: s.points.filter((p) => finite(p.x) && finite(p.y)).sort((a, b) => a.x - b.x) }));
    const all = series.flatMap((s) => s.points);
    if (!all.length) {
      fig.append(el('p', { class: 'empty', text: 'no data yet' }));
      return fig;
    }
    let [x0, x1] = [Math.min(...all.map((p) => p.x)), Math.max(...all.map((p) => p.x))];
    if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
    const ys = all.flatMap((p) => [p.y, p.lo, p.hi]).filter(finite);
    let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
    if (y0 === y1) [y0, y1] = [y0 - (Math.abs(y0) * 0.1 || 0.5), y1 + (Math.abs(y1) * 0.1 || 0.5)];
    const pad = (y1 - y0) * 0.05;
    [y0, y1] = [y0 - pad, y1 + pad];
    const sx = (x) => M.l + ((x - x0) / (x1 - x0)) * (W - M.l - M.r);
    const sy = (y) => H - M.b - ((y - y0) / (y1 - y0)) * (H - M.t - M.b);
    const chart = svg('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, width: W, height: H });
    for (const t of niceTicks(y0, y1, 4)) {
      chart.append(svg('line', { class: 'grid', x1: M.l, x2: W - M.r, y1: sy(t.v), y2: sy(t.v) }));
      chart.append(svg('text', { class: 'tick', x: M.l - 6, y: sy(t.v) + 4, 'text-anchor': 'end', text: t.text }));
    }
    for (const t of niceTicks(x0, x1, 6).filter((t) => Number.isInteger(t.v))) {
      chart.append(svg('text', { class: 'tick', x: sx(t.v), y: H - M.b + 16, 'text-anchor': 'middle', text: String(t.v) }));
    }
    chart.append(svg('text', { class: 'axis', x: W - M.r, y: H - 2, 'text-anchor': 'end', text: 'step' }));
    chart.append(svg('line', { class: 'axis-line', x1: M.l, x2: M.l, y1: M.t, y2: H - M.b }));
    chart.append(svg('line', { class: 'axis-line', x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b }));
    for (const s of series) {
      const banded = s.points.filter((p) => finite(p.lo) && finite(p.hi));
      if (banded.length > 1) {
        const d = 'M' + banded.map((p) => `${sx(p.x)},${sy(p.hi)}`).join(' L') + ' L' +
          [...banded].reverse().map((p) => `${sx(p.x)},${sy(p.lo)}`).join(' L') + ' Z';
        chart.append(svg('path', { class: 'band', d, fill: s.color }));
      }
      if (s.points.length > 1) {
        chart.append(svg('path', { class: 'line', stroke: s.color,
          d: 'M' + s.points.map((p) => `${sx(p.x)},${sy(p.y)}`).join(' L') }));
      }
      if (banded.length === 1) {
        // One point with an interval: an error bar.
        const p = banded[0];
        chart.append(svg('line', { class: 'err', x1: sx(p.x), x2: sx(p.x), y1: sy(p.lo), y2: sy(p.hi), stroke: s.color }));
      }
      if (s.points.length <= 60) {
        for (const p of s.points) chart.append(svg('circle', { class: 'pt', cx: sx(p.x), cy: sy(p.y), r: 2.5, fill: s.color }));
      }
    }
    const guide = svg('line', { class: 'guide', y1: M.t, y2: H - M.b, x1: -10, x2: -10 });
    chart.append(guide);
    const xs = [...new Set(all.map((p) => p.x))].sort((a, b) => a - b);
    const hover = svg('rect', { class: 'hover', x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b });
    hover.addEventListener('mousemove', (ev) => {
      const box = chart.getBoundingClientRect();
      const x = x0 + ((ev.clientX - box.left) * (W / box.width) - M.l) / (W - M.l - M.r) * (x1 - x0);
      const near = xs.reduce((b, v) => (Math.abs(v - x) < Math.abs(b - x) ? v : b), xs[0]);
      guide.setAttribute('x1', sx(near));
      guide.setAttribute('x2', sx(near));
      const rows = [{ text: `step ${near}` }];
      for (const s of series) {
        const p = s.points.find((q) => q.x === near);
        if (!p) continue;
        let t = `${s.label}: ${fmt(p.y, 4)}`;
        if (finite(p.lo) && finite(p.hi)) t += ` [${fmt(p.lo, 3)}, ${fmt(p.hi, 3)}]`;
        if (finite(p.n)) t += ` (n=${p.n})`;
        rows.push({ text: t, color: series.length > 1 ? s.color : null });
      }
      fig.dataset.hover = near;
      showTip(ev, rows);
    });
    hover.addEventListener('mouseleave', () => {
      guide.setAttribute('x1', -10);
      guide.setAttribute('x2', -10);
      hideTip();
    });
    chart.append(hover);
    fig.append(chart);
    if (series.length > 1) {
      fig.append(el('div', { class: 'plot-legend' }, series.map((s) => {
        const sw = el('span', { class: 'swatch' });
        sw.style.background = s.color;
        return el('span', { class: 'item' }, sw, s.label);
      })));
    }
    return fig;
  }

  function sourcesOf(evals) {
    const s = [...new Set(evals.flatMap((e) => Object.keys(e.greedy || {})))].sort();
    return s.includes('all') ? ['all', ...s.filter((x) => x !== 'all')] : s;
  }

  function runPlots(metrics, evals) {
    const grid = el('div', { class: 'plots' });
    for (const [key, title] of RUN_SERIES) {
      grid.append(plot({ key, title, series: [{ label: title, points: metrics.map((m) => ({ x: m.step, y: m[key] })) }] }));
    }
    grid.append(plot({
      key: 'em',
      title: 'held-out EM / F1 (greedy) per data source',
      series: sourcesOf(evals).map((s) => ({
        label: s,
        points: evals.filter((e) => e.greedy && e.greedy[s]).map((e) => ({ x: e.step, y: e.greedy[s].score })),
      })),
    }));
    return grid;
  }

  function experimentPlots(ex) {
    const out = [];
    const toggle = el('label', { class: 'toggle' }, el('input', { type: 'checkbox', id: 'show-sweep',
      onchange: (ev) => { state.showSweep = ev.target.checked; state.curvesKey = ''; renderCurves(); } }),
    ' show the learning-rate sweep runs');
    toggle.querySelector('input').checked = state.showSweep;
    out.push(el('p', { class: 'muted' }, 'Each arm: the mean over its seeds, with the 95% t interval as a band. ', toggle));
    for (const regime of ex.regimes) {
      const groups = regime.groups.filter((g) => state.showSweep || !g.sweep);
      if (!groups.length) continue;
      out.push(el('h2', { text: regime.name ? `regime ${regime.name}` : 'runs' }));
      const keys = [...new Set(groups.flatMap((g) => Object.keys(g.series)))];
      const em = keys.filter((k) => k.startsWith('em:')).sort((a, b) => (a === 'em:all' ? -1 : b === 'em:all' ? 1 : a < b ? -1 : 1));
      const grid = el('div', { class: 'plots' });
      const titles = Object.fromEntries(RUN_SERIES);
      for (const key of [...RUN_SERIES.map(([k]) => k), ...em]) {
        const title = key.startsWith('em:') ? `held-out EM / F1 (greedy): ${key.slice(3)}` : titles[key];
        grid.append(plot({
          key: regime.name ? `${regime.name}:${key}` : key,
          title,
          series: groups.map((g) => ({
            label: `${g.label} (${g.runs.length} seed${g.runs.length === 1 ? '' : 's'})`,
            points: (g.series[key] || []).map((p) => ({ x: p.step, y: p.mean, lo: p.lo, hi: p.hi, n: p.n })),
          })),
        }));
      }
      out.push(grid);
    }
    return out;
  }

  function renderCurves() {
    const box = $('#curves');
    const parts = [];
    if (state.kind === 'experiment' && state.exp) {
      parts.push(el('h1', { text: 'arms side by side' }), ...experimentPlots(state.exp));
      if (state.run !== null) parts.push(el('h1', { text: `run ${state.label}` }));
    }
    if (state.run !== null || state.kind !== 'experiment') parts.push(runPlots(state.metrics, state.evals));
    box.replaceChildren(...parts);
  }

  // ---------------------------------------------------------------- wiring

  function showTab(tab) {
    state.tab = tab;
    for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('active', b.dataset.tab === tab);
    $('#trees-view').hidden = tab !== 'trees';
    $('#curves-view').hidden = tab !== 'curves';
    hideTip();
    writeHash();
  }

  function start() {
    readHash();
    $('#color-mode').value = state.colorMode;
    for (const b of document.querySelectorAll('#tabs button')) b.addEventListener('click', () => showTab(b.dataset.tab));
    $('#step-picker').addEventListener('change', (ev) => {
      const v = ev.target.value;
      state.follow = v === 'latest' || Number(v) === state.steps[state.steps.length - 1];
      const step = v === 'latest' ? state.steps[state.steps.length - 1] : Number(v);
      state.sel = null;
      loadStep(step);
    });
    $('#run-picker').addEventListener('change', (ev) => {
      state.run = Number(ev.target.value);
      state.step = null;
      state.follow = true;
      state.loadedStep = null;
      state.promptIdx = null;
      state.sel = null;
      state.steps = [];
      poll();
    });
    $('#color-mode').addEventListener('change', (ev) => {
      state.colorMode = ev.target.value;
      renderTrees();
      writeHash();
    });
    for (const [id, key] of [['#filter-reward', 'reward'], ['#filter-hops', 'hops'], ['#filter-source', 'source']]) {
      $(id).addEventListener('change', (ev) => {
        state.filters[key] = ev.target.value;
        const visible = visiblePrompts();
        if (!visible.some((p) => p.prompt === state.promptIdx)) {
          state.promptIdx = visible.length ? visible[0].prompt : null;
          state.sel = null;
        }
        renderPrompts();
        renderTrees();
        writeHash();
      });
    }
    showTab(state.tab);
    poll();
    setInterval(poll, POLL_MS);
  }

  start();
})();
