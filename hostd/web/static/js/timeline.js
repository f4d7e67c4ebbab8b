// Renders timeline entries as the server does (templates/run.html,
// "timeline-row"), for timelines that grow live. Everything an entry holds
// is set as text, never as markup: commands and their output are hostile.

let dictionary;

// t is the page's text for key (its language), formatted with args for
// each %s or %d; a key without text shows itself.
export function t(key, ...args) {
  if (!dictionary) {
    const el = document.getElementById('i18n');
    dictionary = el ? JSON.parse(el.textContent) : {};
  }
  let s = dictionary[key];
  if (s === undefined) return null;
  for (const a of args) s = s.replace(/%[sd]/, String(a));
  return s;
}

// count writes a non-negative integer with thousands separators ("5,214").
export function count(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

// money writes micro-dollars as the server does (hostd/money): trailing
// zeros trimmed, never fewer than two decimals ("$0.04", "$0.00353").
export function money(micros) {
  const neg = micros < 0;
  const mag = Math.abs(micros);
  let frac = String(mag % 1000000).padStart(6, '0').replace(/0+$/, '');
  while (frac.length < 2) frac += '0';
  return (neg ? '-' : '') + '$' + count(Math.floor(mag / 1000000)) + '.' + frac;
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function message(ev) {
  const d = ev.data || {};
  if (ev.category === 'Queued' && d.reserved_micros !== undefined) return t('msg.reserved', money(d.reserved_micros));
  if (ev.category === 'Successful' && d.model_calls !== undefined && d.tokens !== undefined) {
    return t('msg.summary', count(d.model_calls), count(d.tokens));
  }
  if (ev.category === 'Worker destroyed' && d.charged_micros !== undefined && d.released_micros !== undefined) {
    return t('msg.settled', money(d.charged_micros), money(d.released_micros));
  }
  return ev.message;
}

// renderRow builds the row of one entry, as the API sends it.
export function renderRow(ev) {
  const d = ev.data || {};
  const li = el('li', 'row cat-' + ev.category.toLowerCase().replace(/ /g, '-'));
  li.dataset.id = String(ev.id);
  li.dataset.t = String(ev.t);
  li.append(el('span', 't', ev.t.toFixed(2)), el('span', 'cat', t('cat.' + ev.category) || ev.category));
  const msg = el('div', 'msg');
  if (ev.category === 'Shell') {
    msg.append(el('code', 'cmd', ev.message));
    if (d.state === 'running') {
      li.classList.add('running');
    } else if (d.exit_code !== undefined) {
      const took = ((d.duration_ms || 0) / 1000).toFixed(2);
      let exit;
      if (d.timed_out) exit = t('exit.timedout', took);
      else if (d.signal) exit = t('exit.signal', d.signal, took);
      else exit = t('exit.code', d.exit_code, took);
      const result = el('div', 'result');
      result.append(el('span', 'exit' + (d.exit_code !== 0 || d.timed_out || d.signal ? ' bad' : ''), exit));
      const out = ((d.stdout || '') + (d.stderr || '') + (d.error || '')).replace(/\n+$/, '');
      if (out) result.append(el('pre', 'out', out));
      msg.append(result);
    }
  } else {
    msg.append(el('span', 'text', message(ev)));
  }
  li.append(msg);
  return li;
}

// upsertRow puts an entry into list in timeline order, replacing the row
// it had for the same entry (an amended command).
export function upsertRow(list, ev) {
  const row = renderRow(ev);
  const old = list.querySelector(`.row[data-id="${ev.id}"]`);
  if (old) {
    old.replaceWith(row);
    return;
  }
  const later = [...list.children].find((r) => Number(r.dataset.id) > ev.id);
  list.insertBefore(row, later || null);
}
