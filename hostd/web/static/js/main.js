// Entry point of every page: wires the page's parts to their modules.
// Module scripts run after the document is parsed.
import { initPlayback } from './playback.js';
import { initLivePage } from './live.js';
import { initPlayground } from './playground.js';

document.querySelectorAll('[data-playback]').forEach(initPlayback);
document.querySelectorAll('[data-live-run]').forEach(initLivePage);
const playground = document.getElementById('playground');
if (playground) initPlayground(playground);
