// Follows a run live over the API's event stream, with the browser's
// session cookie: a command appears when it starts and is amended when it
// ends. The stream ends with the run; the server then answers a reconnect
// with 204, so EventSource stops.
import { t, upsertRow, money } from './timeline.js';

// followRun streams run id's timeline into list and calls onEnd once,
// when the run has ended (or the stream is over for good).
export function followRun(id, list, onEnd) {
  const events = new EventSource('/v1/runs/' + encodeURIComponent(id) + '/events');
  let done = false;
  const finish = () => {
    if (done) return;
    done = true;
    events.close();
    onEnd();
  };
  events.addEventListener('timeline', (e) => upsertRow(list, JSON.parse(e.data)));
  events.addEventListener('end', finish);
  events.addEventListener('error', () => {
    if (events.readyState === EventSource.CLOSED) finish();
  });
  return events;
}

// showResult puts a finished run's answer and cost line (rendered by the
// server, Markdown made safe there) into the page.
export async function showResult(id) {
  const resp = await fetch('/account/runs/' + encodeURIComponent(id) + '/result');
  if (!resp.ok) return null;
  const doc = new DOMParser().parseFromString(await resp.text(), 'text/html');
  const block = doc.querySelector('.result-block');
  const answer = doc.getElementById('answer');
  const cost = doc.getElementById('costline');
  document.getElementById('result').replaceChildren(...(answer ? [document.adoptNode(answer)] : []));
  document.getElementById('cost').replaceChildren(...(cost ? [document.adoptNode(cost)] : []));
  await refreshBalance();
  return block ? block.dataset.status : null;
}

// refreshBalance shows the organisation's balance as it is now.
export async function refreshBalance() {
  const el = document.getElementById('balance');
  if (!el) return;
  const resp = await fetch('/v1/balance');
  if (!resp.ok) return;
  const bal = await resp.json();
  el.dataset.micros = String(bal.available_micros);
  el.textContent = money(bal.available_micros);
}

// cancelRun asks the API to stop a run.
export function cancelRun(id) {
  return fetch('/v1/runs/' + encodeURIComponent(id) + '/cancel', { method: 'POST' });
}

// initLivePage follows the run of a run page that is still active; when
// it ends the page is loaded again, finished.
export function initLivePage(list) {
  const id = list.dataset.liveRun;
  const status = document.getElementById('run-status');
  if (status) status.textContent = t('status.running');
  document.querySelectorAll('[data-cancel]').forEach((b) =>
    b.addEventListener('click', () => {
      b.disabled = true;
      cancelRun(id);
    }),
  );
  followRun(id, list, () => location.reload());
}
