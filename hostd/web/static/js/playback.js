// Plays a finished run's timeline back at its recorded pace: each row
// appears at its t, a command's result when the command ended, the answer
// with the row that ends the run and the cost line at the end. The rows
// are the server's; playback only shows and hides them.
import { t } from './timeline.js';

export function initPlayback(list) {
  const box = list.closest('.timeline-box');
  const player = box && box.querySelector('.player');
  if (!player) return;
  const rows = [...list.querySelectorAll('.row')].map((row) => ({
    row,
    t: Number(row.dataset.t),
    ends: Number(row.dataset.ends || row.dataset.t),
    result: row.querySelector('.result'),
  }));
  const result = document.getElementById('result');
  const cost = document.getElementById('cost');
  const answerT = Number((result && result.dataset.afterT) || 0);
  const end = Math.max(answerT, ...rows.map((r) => Math.max(r.t, r.ends)));
  const play = player.querySelector('[data-play]');
  const speed = player.querySelector('[data-speed]');
  const clockText = player.querySelector('[data-clock]');
  let clock = 0;
  let playing = false;
  let last = 0;

  function show(at) {
    for (const r of rows) {
      r.row.classList.toggle('pending', r.t > at);
      const running = r.result !== null && r.t <= at && r.ends > at;
      r.row.classList.toggle('running', running);
      if (r.result) r.result.classList.toggle('pending', r.ends > at);
    }
    if (result) result.classList.toggle('pending', at < answerT);
    if (cost) cost.classList.toggle('pending', at < end);
    clockText.textContent = at.toFixed(2) + ' s';
  }

  function frame(now) {
    if (!playing) return;
    clock = Math.min(end, clock + ((now - last) / 1000) * Number(speed.value));
    last = now;
    show(clock);
    if (clock >= end) {
      stop();
      return;
    }
    requestAnimationFrame(frame);
  }

  function start() {
    if (clock >= end) clock = 0;
    playing = true;
    play.textContent = t('player.pause');
    last = performance.now();
    requestAnimationFrame(frame);
  }

  function stop() {
    playing = false;
    play.textContent = t('player.play');
  }

  play.addEventListener('click', () => (playing ? stop() : start()));
  player.querySelector('[data-end]').addEventListener('click', () => {
    clock = end;
    show(clock);
    stop();
  });
  player.hidden = false;
  list.dataset.playbackReady = 'true';
  if ('autoplay' in list.dataset) {
    show(0);
    start();
  } else {
    clock = end;
    show(end);
  }
}
