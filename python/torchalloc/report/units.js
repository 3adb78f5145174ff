// The HTML report's numbers as torchalloc.units writes them (bytes, seconds, times) and the timeline's ticks.
//
// html.py inlines this file before page.js, in the same <script> element (the page fetches nothing); page.js
// reads it as torchallocUnits.
var torchallocUnits = (function () {
  'use strict';
  function fmtBytes(n) {
    var units = [['GiB', 1073741824], ['MiB', 1048576], ['KiB', 1024]];
    for (var k = 0; k < units.length; k++) {
      if (Math.abs(n) >= units[k][1]) return (n / units[k][1]).toFixed(1) + ' ' + units[k][0];
    }
    return Math.round(n) + ' B';
  }
  function fmtSeconds(s) {
    if (s < 0) return 'until the end';
    if (s < 1e-3) return (s * 1e6).toFixed(0) + ' \u00b5s';
    if (s < 1) return (s * 1e3).toFixed(1) + ' ms';
    return s.toFixed(2) + ' s';
  }
  function fmtTime(s) { return 't=' + (s < 1 ? fmtSeconds(s) : s.toFixed(3) + ' s'); }
  function niceStep(span, ticks) {
    var raw = span / Math.max(ticks, 1);
    if (raw <= 0) return 1;
    var mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var ms = [1, 2, 2.5, 5, 10];
    for (var k = 0; k < ms.length; k++) if (raw <= ms[k] * mag) return ms[k] * mag;
    return 10 * mag;
  }
  // Tick labels of the time axis: one unit for the range in view, as many decimals as the step needs. A view
  // that starts a second or more into the log is in seconds (15.0001 s reads better than 15000100 \u00b5s).
  function timeTicks(v0, v1) {
    var span = v1 - v0, unit = v0 >= 1 || span >= 2 ? ['s', 1] : span < 2e-3 ? ['\u00b5s', 1e6] : ['ms', 1e3];
    var step = niceStep(span, 8);
    var stepInUnit = Number((step * unit[1]).toPrecision(6));
    var decimals = (stepInUnit.toFixed(12).replace(/0+$/, '').split('.')[1] || '').length;
    var out = [];
    for (var k = Math.ceil(v0 / step - 1e-9); k * step <= v1 * (1 + 1e-9); k++) {
      out.push([k * step, (k * stepInUnit).toFixed(decimals) + ' ' + unit[0]]);
    }
    return out;
  }
  function byteTicks(top) {
    var units = [1073741824, 1048576, 1024], scale = 1;
    for (var k = 0; k < units.length; k++) if (top >= units[k]) { scale = units[k]; break; }
    var step = niceStep(top / scale, 5) * scale, out = [];
    for (var v = 0; v <= top; v += step) out.push(Math.floor(v));
    return out;
  }

  return { fmtBytes: fmtBytes, fmtSeconds: fmtSeconds, fmtTime: fmtTime, timeTicks: timeTicks, byteTicks: byteTicks };
})();
