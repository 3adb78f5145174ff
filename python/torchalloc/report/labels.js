// Where the HTML report's marker labels go: rows above the timeline, none overlapping another.
//
// report/labels.py does the same in Python for the static SVG (its docstring says how); page.js calls this
// for each view it draws, with the widths the browser measured. html.py inlines this file before page.js,
// in the same <script> element, so the page still fetches nothing.
var torchallocPlaceLabels = (function () {
  'use strict';
  function fits(widths, room, gap) {
    var sum = 0;
    widths.forEach(function (w) { sum += w; });
    return sum + gap * Math.max(widths.length - 1, 0) <= room;
  }
  // One row's left edges (labels in x order, known to fit): each centred on its marker, pushed right past the
  // one before it, then pulled back left so that the last ends by hi.
  function pack(xs, widths, lo, hi, gap) {
    var lefts = xs.map(function (x, k) { return Math.min(Math.max(x - widths[k] / 2, lo), hi - widths[k]); });
    for (var k = 1; k < lefts.length; k++) lefts[k] = Math.max(lefts[k], lefts[k - 1] + widths[k - 1] + gap);
    for (k = lefts.length - 1; k >= 0; k--) {
      var end = k === lefts.length - 1 ? hi : lefts[k + 1] - gap;
      lefts[k] = Math.min(lefts[k], end - widths[k]);
    }
    return lefts;
  }
  // Each label's {row, left} (row 0 at the top), or null where not even `rows` rows hold every label between
  // x=lo and x=hi: then every second (third, ...) marker keeps its label. The fewest left out, then the fewest rows.
  return function (xs, widths, lo, hi, rows, gap) {
    var n = xs.length;
    for (var stride = 1; stride <= n; stride++) {
      var shown = [];
      for (var k = 0; k < n; k += stride) shown.push(k);
      for (var used = 1; used <= rows; used++) {
        var members = [];
        for (var r = 0; r < used; r++) members.push(shown.filter(function (_, m) { return m % used === r; }));
        var ok = members.every(function (m) {
          return fits(m.map(function (j) { return widths[j]; }), hi - lo, gap);
        });
        if (!ok) continue;
        var out = xs.map(function () { return null; });
        members.forEach(function (m, row) {
          var lefts = pack(m.map(function (j) { return xs[j]; }), m.map(function (j) { return widths[j]; }), lo, hi, gap);
          m.forEach(function (j, q) { out[j] = { row: row, left: lefts[q] }; });
        });
        return out;
      }
    }
    return xs.map(function () { return null; });
  };
})();
