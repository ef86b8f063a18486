// Runs the widget's inline script against a tiny DOM stub; prints JSON facts about what it drew.
const fs = require('fs');
const script = fs.readFileSync(process.argv[2], 'utf8');
const rootId = process.argv[3];
function ctx() {
  const c = {fills: [], texts: [], fillStyle: null, font: '', textAlign: '', textBaseline: '', strokeStyle: '',
    fillRect(x, y, w, h) { this.fills.push([x, y, w, h, this.fillStyle]); },
    fillText(t, x, y) { this.texts.push(t); }, save() {}, restore() {}, translate() {}, rotate() {},
    beginPath() {}, moveTo() {}, lineTo() {}, stroke() {}, clearRect() {},
    createPattern() { return 'HATCH'; }};
  return c;
}
function el(extra) { return Object.assign({style: {}, value: '', textContent: '', width: 0, height: 0,
  addEventListener() {}, getContext() { return this._ctx || (this._ctx = ctx()); }, getBoundingClientRect() { return {left: 0, top: 0}; }}, extra); }
const els = {canvas: el({}), '.al-cbar': el({width: 70, height: 260}), '.al-tip': el({}), '.al-static': el({}), '.al-live': el({}),
  '.al-layer': el({value: process.argv[4]}), '.al-head': el({value: process.argv[5]}), '.al-scale': el({value: process.argv[6]})};
global.document = {getElementById(id) { if (id !== rootId) throw new Error('bad id ' + id);
  return {querySelector(s) { return els[s]; }}; }, createElement() { return el({}); }};
global.atob = (b) => Buffer.from(b, 'base64').toString('binary');
eval(script);
const fills = els.canvas._ctx.fills;
console.log(JSON.stringify({static: els['.al-static'].style.display, live: els['.al-live'].style.display,
  n: fills.length, fills: fills.slice(1).map(f => f[4]), cbar: els['.al-cbar']._ctx.texts}));
