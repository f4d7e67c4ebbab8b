// The playground: builds the run request from the form (and shows it as
// request.json beside the curl line while it is edited), runs it in the
// signed-in member's organisation through the /v1 API with the session
// cookie and a fresh Idempotency-Key, and follows the run live. Signed
// out, "Register and run" and "Sign in" keep the request in this tab's
// session storage and the playground fills it in again afterwards.
import { t } from './timeline.js';
import { followRun, showResult, cancelRun, refreshBalance } from './live.js';

const keptRequest = 'ephemeral.playground.request';

// uuid is a random (version 4) UUID; crypto.randomUUID needs a secure
// context, which a daemon reached over plain http on a LAN address is not.
function uuid() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

// requestFromForm is the request the form describes, as request.json.
export function requestFromForm(form) {
  const f = form.elements;
  const req = { prompt: f.prompt.value };
  if (f.model.value) req.model = f.model.value;
  req.shell = f.shell.checked;
  req.web = f.web.checked;
  const conns = new Map();
  for (const box of form.querySelectorAll('input[name="connection"]:checked')) {
    const [name, method] = box.value.split(' ');
    if (!conns.has(name)) conns.set(name, []);
    conns.get(name).push(method);
  }
  if (conns.size > 0) req.connections = [...conns].map(([name, methods]) => ({ name, methods }));
  const files = [];
  for (const row of form.querySelectorAll('#file-rows .file-row')) {
    const path = row.querySelector('[name="file_path"]').value;
    if (path !== '') files.push({ path, content: row.querySelector('[name="file_content"]').value });
  }
  if (files.length > 0) req.files = files;
  req.timeout_seconds = parseInt(f.timeout_seconds.value, 10);
  req.max_cost_micros = Math.round(parseFloat(f.budget.value) * 1e6);
  if (f.zero_data_retention.checked) req.zero_data_retention = true;
  if (f.replay && f.replay.checked) req.replay = f.replay.value;
  return req;
}

function addFileRow(form, path, content) {
  const tmpl = form.querySelector('#file-row-template');
  const row = tmpl.content.firstElementChild.cloneNode(true);
  row.querySelector('[name="file_path"]').value = path;
  row.querySelector('[name="file_content"]').value = content;
  form.querySelector('#file-rows').append(row);
}

// fillForm sets the form to req (a kept request).
function fillForm(form, req) {
  const f = form.elements;
  f.prompt.value = req.prompt || '';
  if (req.model && [...f.model.options].some((o) => o.value === req.model)) f.model.value = req.model;
  f.shell.checked = !!req.shell;
  f.web.checked = !!req.web;
  const granted = new Set();
  for (const c of req.connections || []) for (const m of c.methods) granted.add(c.name + ' ' + m);
  for (const box of form.querySelectorAll('input[name="connection"]')) box.checked = granted.has(box.value);
  form.querySelector('#file-rows').replaceChildren();
  for (const file of req.files || []) addFileRow(form, file.path, file.content);
  if (req.timeout_seconds) f.timeout_seconds.value = req.timeout_seconds;
  if (req.max_cost_micros) f.budget.value = (req.max_cost_micros / 1e6).toString();
  f.zero_data_retention.checked = !!req.zero_data_retention;
  if (f.replay && !f.replay.disabled) f.replay.checked = !!req.replay;
}

function showPreview(form) {
  document.getElementById('pg-request').textContent = JSON.stringify(requestFromForm(form), null, 2);
}

async function run(form) {
  const error = document.getElementById('pg-error');
  const button = document.getElementById('run');
  error.hidden = true;
  button.disabled = true;
  let resp;
  try {
    resp = await fetch('/v1/runs', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Idempotency-Key': uuid() },
      body: JSON.stringify(requestFromForm(form)),
    });
  } catch (e) {
    error.textContent = t('pg.failed') + ' ' + e;
    error.hidden = false;
    button.disabled = false;
    return;
  }
  const body = await resp.json();
  if (!resp.ok) {
    const e = body.error || {};
    error.textContent = t('pg.failed') + ' ' + (e.message || resp.status) + (e.param ? ` (${e.param})` : '');
    error.hidden = false;
    button.disabled = false;
    return;
  }
  await refreshBalance();
  const section = document.getElementById('pg-run');
  const list = document.getElementById('pg-timeline');
  const status = document.getElementById('run-status');
  const link = document.getElementById('run-link');
  const cancel = document.getElementById('cancel');
  list.replaceChildren();
  document.getElementById('result').replaceChildren();
  document.getElementById('cost').replaceChildren();
  status.textContent = t('status.running');
  status.className = 'status status-running';
  link.textContent = body.id;
  link.href = '/account/runs/' + body.id;
  section.hidden = false;
  section.dataset.runId = body.id;
  cancel.hidden = false;
  cancel.disabled = false;
  cancel.onclick = () => {
    cancel.disabled = true;
    cancelRun(body.id);
  };
  section.scrollIntoView({ block: 'start' });
  followRun(body.id, list, async () => {
    const final = (await showResult(body.id)) || 'failed';
    status.textContent = t('status.' + final) || final;
    status.className = 'status status-' + final;
    section.dataset.finished = final;
    cancel.hidden = true;
    button.disabled = false;
  });
}

export function initPlayground(form) {
  const params = new URLSearchParams(location.search);
  const kept = sessionStorage.getItem(keptRequest);
  if (params.has('restore') && kept) {
    try {
      fillForm(form, JSON.parse(kept));
    } catch {
      // A kept request that does not parse is dropped.
    }
    sessionStorage.removeItem(keptRequest);
  }
  form.addEventListener('input', () => showPreview(form));
  form.addEventListener('change', () => showPreview(form));
  form.addEventListener('click', (e) => {
    if (e.target.closest('[data-add-file]')) {
      addFileRow(form, '', '');
      showPreview(form);
    }
    const remove = e.target.closest('[data-remove-file]');
    if (remove) {
      remove.closest('.file-row').remove();
      showPreview(form);
    }
  });
  // Signed out: keep the request through registering or signing in.
  for (const a of form.querySelectorAll('[data-keep-request]')) {
    a.addEventListener('click', () => {
      sessionStorage.setItem(keptRequest, JSON.stringify(requestFromForm(form)));
      const target = new URL(a.href, location.href);
      const next = new URL(target.searchParams.get('next') || '/playground', location.href);
      next.searchParams.set('restore', '1');
      target.searchParams.set('next', next.pathname + next.search);
      a.href = target.pathname + target.search;
    });
  }
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    if (form.dataset.signedIn) run(form);
  });
  showPreview(form);
  form.dataset.ready = 'true';
}

