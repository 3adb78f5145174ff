// The interactive part of torchalloc's HTML report (html.py inlines this file after units.js and labels.js).
//
// Reads the JSON the page embeds (data.py) and, with no library and
// nothing fetched: redraws the timeline SVG for the range in view (zoom with
// the wheel, the buttons or +/-; pan by dragging or with the arrow keys),
// shows a tooltip under the mouse (time, allocated, reserved, the phase then,
// the nearest marker), lists the blocks live at a clicked moment (largest
// first), opens a module of the "Memory by module" table (its blocks at the
// peak, then one of them), and opens a block's or a lifetime row's detail (stacks, lifetime,
// reason). Without JavaScript the page keeps its static SVG and tables.
//
// Test hook: a page URL ending in #test=step,step,... runs those steps
// after load through the same handlers a user's clicks reach (see TEST_STEPS)
// and writes what ran to <body data-test-done>, the view and selection after
// each step (and the blocks listed) to data-test-trace, or the error to data-test-error;
// python/tests/test_report_page.py reads the DOM Chromium dumps afterwards.
(function () {
  'use strict';
  var dataElement = document.getElementById('report-data');
  var svg = document.getElementById('timeline');
  if (!dataElement || !svg) return;
  var D = JSON.parse(dataElement.textContent);
  var TL = D.timeline, B = D.blocks, L = D.layout;
  if (!TL.t.length) return;
  var NS = svg.namespaceURI;
  var PW = L.w - L.left - L.right, PH = L.h - L.top - L.bottom;
  var RUN = D.xmax - D.xmin; // the plot spans the logged activity, not the time before the first event
  var MIN_SPAN = RUN / 1e6; // the deepest zoom: a millionth of the run
  var PAGE = 25; // rows of a moment's listing shown at a time
  var view = { v0: D.xmin, v1: D.xmax };
  var selected = null; // the selected moment: {i, t, allocated, reserved, live, label, oom}
  var testing = false; // set by the test hook: no scrolling (the screenshot shows the page's top)

  // ---- formatting and ticks (units.js) ----------------------------------
  var fmtBytes = torchallocUnits.fmtBytes, fmtSeconds = torchallocUnits.fmtSeconds, fmtTime = torchallocUnits.fmtTime;
  var timeTicks = torchallocUnits.timeTicks, byteTicks = torchallocUnits.byteTicks;

  // ---- DOM helpers: text goes in as text, never as markup -----------------
  function svgNode(tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function titled(e, text) { e.appendChild(svgNode('title', {}, text)); return e; }
  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    [].concat(children == null ? [] : children).forEach(function (c) {
      e.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
    });
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }

  // ---- the timeline -------------------------------------------------------
  function X(t) { return L.left + (t - view.v0) / (view.v1 - view.v0) * PW; }
  function Y(v) { return L.top + PH - v / D.ymax * PH; }
  function f2(x) { return x.toFixed(2); }
  // The last sample at or before t: levels hold until the next event. 0 before the first.
  function sampleAt(t) {
    var lo = 0, hi = TL.t.length - 1;
    while (lo < hi) { var m = (lo + hi + 1) >> 1; if (TL.t[m] <= t) lo = m; else hi = m - 1; }
    return lo;
  }
  // Steps through samples j0..j1: each sample's level, level(j), holds until the next sample.
  function stepPoints(level, j0, j1) {
    var pts = [];
    for (var j = j0; j <= j1; j++) {
      var x = X(TL.t[j]);
      if (j > j0) pts.push([x, level(j - 1)]);
      pts.push([x, level(j)]);
    }
    return pts;
  }
  function pathOf(pts) { return pts.map(function (p) { return f2(p[0]) + ',' + f2(Y(p[1])); }).join(' L'); }
  // The closed path between two step curves over samples j0..j1.
  function bandPath(lowerAt, upperAt, j0, j1) {
    return 'M' + pathOf(stepPoints(upperAt, j0, j1)) + ' L' + pathOf(stepPoints(lowerAt, j0, j1).reverse()) + ' Z';
  }

  // The markers: a line each, its label in a row above the plot (labels.js) with a leader down to the line.
  function drawMarkers(plot) {
    var shown = D.markers.filter(function (m) { return m.t >= view.v0 && m.t <= view.v1; });
    var labels = shown.map(function (m) { // measured as drawn, then placed
      var t = svgNode('text', { x: 0, y: 0, 'class': 'marker-label' }, m.label);
      svg.appendChild(t);
      return t;
    });
    var widths = labels.map(function (t) { return t.getComputedTextLength(); });
    labels.forEach(function (t) { svg.removeChild(t); });
    var xs = shown.map(function (m) { return X(m.t); });
    var places = torchallocPlaceLabels(xs, widths, L.left, L.left + PW, L.label_rows, L.label_gap);
    shown.forEach(function (m, k) {
      var x = xs[k], g = svgNode('g', { 'class': 'marker', 'data-label': m.label }), p = places[k];
      g.appendChild(svgNode('line', { x1: f2(x), x2: f2(x), y1: L.top, y2: L.top + PH, stroke: '#6b4fa0', 'stroke-width': 1,
        'stroke-dasharray': '2 2' }));
      if (p) {
        var base = L.top - 14 - (L.label_rows - 1 - p.row) * L.row_h; // row 0 at the top, as svg.py
        g.appendChild(svgNode('line', { 'class': 'marker-leader', x1: f2(p.left + widths[k] / 2), y1: base + 3, x2: f2(x),
          y2: L.top, stroke: '#6b4fa0', 'stroke-width': 0.7, 'stroke-opacity': 0.6 }));
        g.appendChild(svgNode('text', { x: f2(p.left), y: base, 'class': 'marker-label', 'data-row': p.row }, m.label));
      }
      plot.appendChild(titled(g, 'marker ' + m.label + ' at ' + fmtTime(m.t) + ' (' + m.phase + ')'));
    });
  }

  function render() {
    clear(svg);
    svg.setAttribute('data-view', view.v0 + ' ' + view.v1);
    var defs = svgNode('defs', {}), clip = svgNode('clipPath', { id: 'plot-clip' });
    clip.appendChild(svgNode('rect', { x: L.left, y: 0, width: PW, height: L.top + PH + L.strip + 4 }));
    defs.appendChild(clip);
    svg.appendChild(defs);
    svg.appendChild(svgNode('rect', { x: L.left, y: L.top, width: PW, height: PH, fill: '#fbfbfd', stroke: '#d0d0d8' }));
    byteTicks(D.ymax).forEach(function (v) {
      var y = Y(v);
      svg.appendChild(svgNode('line', { 'class': 'grid', x1: L.left, x2: L.left + PW, y1: f2(y), y2: f2(y),
        stroke: '#e6e6ee' }));
      svg.appendChild(svgNode('text', { x: L.left - 6, y: f2(y + 4), 'text-anchor': 'end', 'class': 'tick' }, fmtBytes(v)));
    });
    timeTicks(view.v0, view.v1).forEach(function (tick) {
      var x = X(tick[0]);
      svg.appendChild(svgNode('line', { 'class': 'grid', x1: f2(x), x2: f2(x), y1: L.top, y2: L.top + PH,
        stroke: '#eeeef4' }));
      svg.appendChild(svgNode('text', { x: f2(x), y: L.top + PH + L.strip + 18, 'text-anchor': 'middle',
        'class': 'tick x-tick', 'data-t': tick[0] }, tick[1]));
    });
    var plot = svgNode('g', { 'clip-path': 'url(#plot-clip)' });
    svg.appendChild(plot);
    var j0 = sampleAt(view.v0), j1 = Math.min(TL.t.length - 1, sampleAt(view.v1) + 1);
    var lower = new Array(j1 - j0 + 1).fill(0); // the phases stack in order: each on the ones before it
    TL.phases.forEach(function (name, p) {
      var values = TL.by_phase[p], upper = lower.map(function (v, k) { return v + values[j0 + k]; });
      if (Math.max.apply(null, upper) > 0) {
        var below = lower;
        var top = stepPoints(function (j) { return upper[j - j0]; }, j0, j1);
        var bottom = stepPoints(function (j) { return below[j - j0]; }, j0, j1).reverse();
        plot.appendChild(titled(svgNode('path', { 'class': 'phase-area', 'data-phase': name, fill: D.colors[p],
          'fill-opacity': '0.82', stroke: D.colors[p], 'stroke-width': '0.6',
          d: 'M' + pathOf(top) + ' L' + pathOf(bottom) + ' Z' }), 'allocated by ' + name));
      }
      lower = upper;
    });
    if (TL.fragmented && TL.fragmented.length === TL.t.length) {
      // free bytes in segments that hold live blocks, on top of allocated; the cache above it, up to reserved
      var base = lower;
      var fragTop = function (j) { return base[j - j0] + TL.fragmented[j]; };
      var cacheTop = function (j) { return Math.max(TL.reserved[j], fragTop(j)); };
      if (Math.max.apply(null, TL.fragmented) > 0) {
        plot.appendChild(titled(svgNode('path', { 'class': 'fragmented-area', fill: L.frag_fill, 'fill-opacity': '0.55',
          stroke: '#b07a00', 'stroke-width': '0.5', d: bandPath(function (j) { return base[j - j0]; }, fragTop, j0, j1) }),
          'free in segments that hold live blocks (fragmentation)'));
      }
      var cached = false;
      for (var j = j0; j <= j1 && !cached; j++) cached = cacheTop(j) > fragTop(j);
      if (cached) {
        plot.appendChild(titled(svgNode('path', { 'class': 'cache-area', fill: L.cache_fill, 'fill-opacity': '0.55',
          stroke: '#5b7fb0', 'stroke-width': '0.5', d: bandPath(fragTop, cacheTop, j0, j1) }),
          'wholly free segments (cache) and free mapped granules of expandable segments: reserved, no live block ' +
          'in them'));
      }
    }
    plot.appendChild(titled(svgNode('path', { 'class': 'reserved-line', fill: 'none', stroke: '#222', 'stroke-width': '1.6',
      'stroke-dasharray': '6 3', d: 'M' + pathOf(stepPoints(function (j) { return TL.reserved[j]; }, j0, j1)) }),
      'reserved'));
    D.spans.forEach(function (s) {
      if (s[2] < view.v0 || s[1] > view.v1) return;
      var name = D.phase_names[s[0]], x0 = X(s[1]), x1 = X(s[2]);
      plot.appendChild(titled(svgNode('rect', { 'class': 'phase-span', 'data-phase': name, x: f2(x0), y: L.top + PH + 2,
        width: f2(Math.max(x1 - x0, 0.8)), height: L.strip, fill: D.colors[s[0]] || '#999' }),
        name + ': ' + fmtTime(s[1]) + ' to ' + fmtSeconds(s[2])));
    });
    drawMarkers(plot);
    var peakReserved = Math.max.apply(null, TL.reserved);
    D.ooms.forEach(function (o) {
      if (o.t < view.v0 || o.t > view.v1) return;
      var x = X(o.t), y = Y(peakReserved), g = svgNode('g', { 'class': 'oom-marker' });
      g.appendChild(svgNode('path', { stroke: '#d62728', 'stroke-width': 3, d: 'M' + f2(x - 6) + ',' + f2(y - 6) + ' L' +
        f2(x + 6) + ',' + f2(y + 6) + ' M' + f2(x - 6) + ',' + f2(y + 6) + ' L' + f2(x + 6) + ',' + f2(y - 6) }));
      plot.appendChild(titled(g, 'out of memory: ' + fmtBytes(o.requested) + ' asked at ' + fmtTime(o.t)));
    });
    if (D.peak && D.peak.allocated && D.peak.t >= view.v0 && D.peak.t <= view.v1) {
      var px = X(D.peak.t), py = Y(D.peak.allocated), end = px > L.left + PW * 0.75;
      var g = svgNode('g', { 'class': 'peak-marker' });
      g.appendChild(svgNode('circle', { cx: f2(px), cy: f2(py), r: 5.5, fill: '#d62728', stroke: '#fff',
        'stroke-width': 1.5 }));
      g.appendChild(svgNode('text', { x: f2(px + (end ? -9 : 9)), y: f2(Math.max(py - 8, L.top + 12)),
        'text-anchor': end ? 'end' : 'start', 'class': 'peak-label' },
        'peak ' + fmtBytes(D.peak.allocated) + ' at ' + fmtTime(D.peak.t)));
      plot.appendChild(g);
    }
    if (selected && selected.t >= view.v0 && selected.t <= view.v1) {
      var sx = f2(X(selected.t));
      plot.appendChild(svgNode('line', { id: 'selection', x1: sx, x2: sx, y1: L.top, y2: L.top + PH, stroke: '#111',
        'stroke-width': 2 }));
    }
    plot.appendChild(svgNode('line', { id: 'hover-line', x1: 0, x2: 0, y1: L.top, y2: L.top + PH, stroke: '#888',
      visibility: 'hidden' }));
    var lx = L.left, ly = L.h - 14;
    TL.phases.forEach(function (name, p) {
      svg.appendChild(svgNode('rect', { x: lx, y: ly - 9, width: 12, height: 10, fill: D.colors[p] }));
      svg.appendChild(svgNode('text', { x: lx + 16, y: ly, 'class': 'legend' }, name));
      lx += 28 + 7 * name.length;
    });
    [['legend-fragmentation', L.frag_fill, '#b07a00', 'fragmentation'],
      ['legend-cache', L.cache_fill, '#5b7fb0', 'cache (free segments)']].forEach(function (b) {
      svg.appendChild(svgNode('rect', { 'class': b[0], x: lx, y: ly - 9, width: 12, height: 10, fill: b[1],
        'fill-opacity': '0.55', stroke: b[2] }));
      svg.appendChild(svgNode('text', { x: lx + 16, y: ly, 'class': 'legend' }, b[3]));
      lx += 28 + 7 * b[3].length;
    });
    svg.appendChild(svgNode('line', { x1: lx, x2: lx + 22, y1: ly - 4, y2: ly - 4, stroke: '#222', 'stroke-width': 1.6,
      'stroke-dasharray': '6 3' }));
    svg.appendChild(svgNode('text', { x: lx + 26, y: ly, 'class': 'legend' }, 'reserved'));
    var zoomed = view.v1 - view.v0 < RUN * (1 - 1e-9);
    svg.appendChild(svgNode('text', { x: L.w - L.right, y: ly, 'text-anchor': 'end', 'class': 'legend view-range' },
      zoomed ? 'showing ' + fmtTime(view.v0) + ' to ' + fmtTime(view.v1) : ''));
  }

  // ---- zoom and pan -------------------------------------------------------
  function setView(v0, v1) {
    var span = Math.min(Math.max(v1 - v0, MIN_SPAN), RUN);
    v0 = Math.min(Math.max(v0, D.xmin), D.xmax - span);
    view = { v0: v0, v1: v0 + span };
    render();
  }
  function zoom(factor, center) {
    var c = center == null ? (view.v0 + view.v1) / 2 : center;
    setView(c - (c - view.v0) * factor, c + (view.v1 - c) * factor);
  }
  function pan(fraction) { var s = view.v1 - view.v0; setView(view.v0 + s * fraction, view.v1 + s * fraction); }
  // SVG user units from a mouse event (the SVG may be drawn scaled)
  function svgX(ev) { var r = svg.getBoundingClientRect(); return (ev.clientX - r.left) * L.w / r.width; }
  function inPlot(x) { return x >= L.left && x <= L.left + PW; }
  function timeAtX(x) { return view.v0 + (x - L.left) / PW * (view.v1 - view.v0); }

  var drag = null;
  svg.addEventListener('mousedown', function (ev) {
    if (ev.button !== 0 || !inPlot(svgX(ev))) return;
    drag = { x: ev.clientX, v0: view.v0, v1: view.v1, moved: false };
    ev.preventDefault();
  });
  window.addEventListener('mousemove', function (ev) {
    if (!drag) return;
    var dx = (ev.clientX - drag.x) * L.w / svg.getBoundingClientRect().width;
    if (Math.abs(dx) > 3) drag.moved = true; // a click that wobbles a pixel is still a click
    if (drag.moved) {
      var dt = dx / PW * (drag.v1 - drag.v0);
      setView(drag.v0 - dt, drag.v1 - dt);
      hideTooltip();
    }
  });
  window.addEventListener('mouseup', function (ev) {
    if (!drag) return;
    var wasClick = !drag.moved;
    drag = null;
    var x = svgX(ev);
    if (wasClick && inPlot(x)) selectMoment(sampleMoment(sampleAt(timeAtX(x))));
  });
  svg.addEventListener('wheel', function (ev) {
    var x = svgX(ev);
    if (!inPlot(x)) return;
    ev.preventDefault();
    zoom(ev.deltaY < 0 ? 0.8 : 1.25, timeAtX(x));
  }, { passive: false });
  svg.addEventListener('keydown', function (ev) {
    var keys = { '+': function () { zoom(0.5); }, '=': function () { zoom(0.5); }, '-': function () { zoom(2); },
      ArrowLeft: function () { pan(-0.1); }, ArrowRight: function () { pan(0.1); },
      Home: function () { setView(D.xmin, D.xmax); },
      Enter: function () { selectMoment(sampleMoment(sampleAt((view.v0 + view.v1) / 2))); } };
    if (keys[ev.key]) { keys[ev.key](); ev.preventDefault(); }
  });

  // ---- hover --------------------------------------------------------------
  var tooltip = document.getElementById('tooltip');
  // The innermost phase running at t: of the spans that contain it, the one that began last.
  function phaseAt(t) {
    var best = null;
    D.spans.forEach(function (s) { if (s[1] <= t && t <= s[2] && (!best || s[1] >= best[1])) best = s; });
    return best ? D.phase_names[best[0]] : null;
  }
  function nearestMarker(t) {
    var best = null;
    D.markers.forEach(function (m) { if (!best || Math.abs(m.t - t) < Math.abs(best.t - t)) best = m; });
    return best;
  }
  function hideTooltip() {
    tooltip.hidden = true;
    var line = document.getElementById('hover-line');
    if (line) line.setAttribute('visibility', 'hidden');
  }
  function hover(ev) {
    var x = svgX(ev);
    if (drag || !inPlot(x)) { hideTooltip(); return; }
    var t = timeAtX(x), j = sampleAt(t), phase = phaseAt(t), marker = nearestMarker(t);
    var lines = [fmtTime(t), 'allocated ' + fmtBytes(TL.allocated[j]) + ', reserved ' + fmtBytes(TL.reserved[j]) +
      (TL.fragmented ? ', fragmentation ' + fmtBytes(TL.fragmented[j]) + ', cache ' +
        fmtBytes(Math.max(TL.reserved[j] - TL.allocated[j] - TL.fragmented[j], 0)) : ''),
      TL.live[j] + ' live blocks', 'phase: ' + (phase || 'none'),
      marker ? 'nearest marker: ' + marker.label + ' at ' + fmtTime(marker.t) : 'no markers'];
    clear(tooltip);
    lines.forEach(function (s, k) { tooltip.appendChild(el('div', k ? {} : { 'class': 'tip-time' }, s)); });
    tooltip.setAttribute('data-sample', j);
    tooltip.hidden = false;
    var wrap = tooltip.parentNode.getBoundingClientRect(), left = ev.clientX - wrap.left + 14;
    if (left + tooltip.offsetWidth > wrap.width) left = ev.clientX - wrap.left - tooltip.offsetWidth - 14;
    tooltip.style.left = left + 'px';
    tooltip.style.top = (ev.clientY - wrap.top + 14) + 'px';
    var line = document.getElementById('hover-line');
    line.setAttribute('x1', f2(x)); line.setAttribute('x2', f2(x)); line.setAttribute('visibility', 'visible');
  }
  svg.addEventListener('mousemove', hover);
  svg.addEventListener('mouseleave', hideTooltip);

  // ---- a moment and the blocks live then ----------------------------------
  var momentPanel = document.getElementById('moment'), detailPanel = document.getElementById('detail');
  function sampleMoment(j) {
    return { i: TL.i[j], t: TL.t[j], allocated: TL.allocated[j], reserved: TL.reserved[j], live: TL.live[j],
      label: fmtTime(TL.t[j]) };
  }
  function heldLiveAt(i) {
    var out = [];
    for (var k = 0; k < B.id.length; k++) {
      if (B.alloc_i[k] <= i && (B.free_i[k] < 0 || B.free_i[k] > i)) out.push(k);
    }
    return out.sort(function (a, b) { return B.size[b] - B.size[a] || B.id[a] - B.id[b]; });
  }
  function siteLabel(s) { return s < 0 ? '(none)' : D.sites[s][0]; }
  // Where, in full: "at FILE:LINE in FUNCTION", or a stand-in's label ("(no Python stack)")
  function siteWhere(s) { return s < 0 ? '' : D.sites[s][2] ? 'at ' + D.sites[s][1] : D.sites[s][0]; }
  function reveal(e) { if (!testing && e.scrollIntoView) e.scrollIntoView({ block: 'nearest' }); }

  function selectMoment(m) {
    selected = m;
    if (m.t < view.v0 || m.t > view.v1) { var s = view.v1 - view.v0; setView(m.t - s / 2, m.t + s / 2); } else render();
    listMoment(PAGE);
    reveal(momentPanel);
  }
  function listMoment(count) {
    var m = selected, held = heldLiveAt(m.i), heldBytes = 0;
    held.forEach(function (k) { heldBytes += B.size[k]; });
    clear(momentPanel);
    momentPanel.appendChild(el('h3', {}, 'At ' + m.label + (m.label.indexOf('t=') === 0 ? '' : ' (' + fmtTime(m.t) + ')')));
    momentPanel.appendChild(el('p', { 'class': 'moment-summary', 'data-index': m.i, 'data-live': m.live,
      'data-bytes': m.allocated, 'data-listed': held.length },
      fmtBytes(m.allocated) + ' allocated, ' + fmtBytes(m.reserved) + ' reserved, ' + m.live + ' live blocks' +
      (m.live ? ', largest first:' : '.')));
    if (m.oom) {
      var o = m.oom;
      momentPanel.appendChild(el('div', { 'class': 'oom-box' }, [el('b', {}, 'Out of memory'),
        ': ' + fmtBytes(o.requested) + ' asked in ' + o.phase + ' at ' + o.site + '. Verdict: ',
        el('b', { 'class': 'verdict' }, o.verdict), ' (' + o.verdict_from + '). ',
        el('span', { 'class': 'oom-why' }, o.explanation)]));
      if (o.advice && o.advice.length) { // each advice line with what the replay said of it
        momentPanel.appendChild(el('ol', { 'class': 'advice' }, o.advice.map(function (a) {
          var cls = a.confirmed === null ? 'unchecked' : a.confirmed ? 'confirmed' : 'refuted';
          return el('li', { value: a.number }, [a.text, el('br', {}), el('span', { 'class': 'check ' + cls }, a.check)]);
        })));
      }
    }
    if (held.length < m.live) { // the page's data holds only the largest blocks of each moment: say what is missing
      var atLeast = D.budget.priority.indexOf(m.i) >= 0 ? D.budget.per_moment : D.budget.exact;
      momentPanel.appendChild(el('p', { 'class': 'note cut-note' }, 'This page holds ' + held.length + ' of the ' +
        m.live + ' blocks live then (' + fmtBytes(heldBytes) + ' of ' + fmtBytes(m.allocated) + '): at most the ' +
        D.budget.per_moment + ' largest of each moment and ' + D.budget.total + ' in all, so at least the ' +
        atLeast + ' largest here. The other ' + (m.live - held.length) + ', ' + fmtBytes(m.allocated - heldBytes) +
        ', are not listed; torchalloc report LOG --at ' + m.t + ' groups every one of them.'));
    }
    if (!held.length) return;
    var body = el('tbody');
    held.slice(0, count).forEach(function (k) {
      var row = el('tr', { 'class': 'block-row', 'data-block': k, 'data-id': B.id[k], 'data-bytes': B.size[k] }, [
        el('td', { 'class': 'num' }, el('button', { type: 'button', 'class': 'linklike' }, fmtBytes(B.size[k]))),
        el('td', { 'class': 'num' }, fmtBytes(B.requested[k])), el('td', {}, D.phase_names[B.phase[k]]),
        el('td', {}, siteLabel(B.site[k])), el('td', {}, D.reasons[B.reason[k]]),
        el('td', { 'class': 'num' }, B.alloc_t[k] < 0 ? 'before the log' : fmtTime(B.alloc_t[k]))]);
      row.addEventListener('click', function () { showBlock(k); });
      body.appendChild(row);
    });
    var head = el('tr', {}, ['bytes', 'requested', 'phase', 'site', 'reason', 'allocated'].map(function (h, c) {
      return el('th', c < 2 || c === 5 ? { 'class': 'num' } : {}, h);
    }));
    momentPanel.appendChild(el('table', { 'class': 'live-blocks' }, [el('thead', {}, head), body]));
    if (held.length > count) {
      var more = el('button', { type: 'button', 'class': 'more' }, 'show ' + Math.min(PAGE, held.length - count) +
        ' more (' + (held.length - count) + ' not shown)');
      more.addEventListener('click', function () { listMoment(count + PAGE); });
      momentPanel.appendChild(more);
    }
  }

  // ---- a block, or a lifetime row, in detail ------------------------------
  function stackList(id, cls) {
    return el('ol', { 'class': 'stack ' + cls }, D.stacks[id].map(function (f) {
      var frame = D.frames[f];
      return el('li', { 'class': frame[3] ? 'frame user' : 'frame' },
        D.files[frame[0]] + ':' + frame[1] + ' in ' + frame[2]);
    }));
  }
  function noStack(what) {
    return el('p', { 'class': 'small no-stack' }, D.has_stacks ? 'no Python frames: ' + what +
      ' on a thread without Python (autograd\u2019s engine, a C++ thread)' :
      'the log was written without stacks (stacks:1 records them)');
  }
  function blockFacts(k) {
    var freed = B.free_i[k] >= 0, before = B.alloc_i[k] < 0;
    var facts = [
      ['size', fmtBytes(B.size[k]) + ' (' + B.size[k].toLocaleString('en') + ' B), ' +
        B.requested[k].toLocaleString('en') + ' B requested'],
      ['allocated', (before ? 'before the log began' : fmtTime(B.alloc_t[k]) + ' in ' + D.phase_names[B.phase[k]] +
        ', ' + siteWhere(B.site[k]))],
      ['freed', freed ? fmtTime(B.free_t[k]) + ' in ' + D.phase_names[B.free_phase[k]] +
        (B.free_site[k] >= 0 ? ', ' + siteWhere(B.free_site[k]) : '') : 'still live at the end of the log'],
      ['lifetime', freed && !before ? fmtSeconds(B.free_t[k] - B.alloc_t[k]) : freed ? 'from before the log began' :
        'until the end'],
      ['what for', D.categories[B.category[k]]]];
    if (B.module && B.module[k] >= 0) {
      facts.push(['module', D.module_names[B.module[k]] + ' (' + D.module_what[B.module_what[k]] + ')']);
    }
    return el('dl', { 'class': 'facts' }, facts.reduce(function (out, f) {
      return out.concat([el('dt', {}, f[0]), el('dd', {}, f[1])]);
    }, []));
  }
  function blockStacks(k) {
    var out = [el('h4', {}, 'Allocation stack (innermost first)')];
    out.push(B.alloc_stack[k] >= 0 ? stackList(B.alloc_stack[k], 'alloc-stack') :
      B.alloc_i[k] < 0 ? el('p', { 'class': 'small no-stack' }, 'allocated before the log began') : noStack('allocated'));
    out.push(el('h4', {}, 'Free stack'));
    out.push(B.free_i[k] < 0 ? el('p', { 'class': 'small still-live' }, 'still live at the end of the log') :
      B.free_stack[k] >= 0 ? stackList(B.free_stack[k], 'free-stack') : noStack('freed'));
    return out;
  }
  function showBlock(k) {
    [].forEach.call(document.querySelectorAll('tr.block-row'), function (r) {
      r.classList.toggle('selected', +r.getAttribute('data-block') === k);
    });
    clear(detailPanel).setAttribute('data-kind', 'block');
    detailPanel.setAttribute('data-id', B.id[k]);
    detailPanel.appendChild(el('h3', {}, 'Block ' + B.addr[k] + ', ' + fmtBytes(B.size[k])));
    detailPanel.appendChild(el('p', { 'class': 'reason why' }, D.sentences[B.why[k]]));
    detailPanel.appendChild(blockFacts(k));
    blockStacks(k).forEach(function (e) { detailPanel.appendChild(e); });
    reveal(detailPanel);
  }
  function showLifetime(r) {
    var row = D.lifetimes[r], k = row.block;
    clear(detailPanel).setAttribute('data-kind', 'site');
    detailPanel.setAttribute('data-id', B.id[k]);
    detailPanel.appendChild(el('h3', {}, 'Site ' + row.site));
    detailPanel.appendChild(el('p', { 'class': 'small' }, row.location));
    detailPanel.appendChild(el('p', { 'class': 'reason why' }, row.why));
    detailPanel.appendChild(el('p', {}, row.count + ' blocks, ' + fmtBytes(row.bytes) + ', ' + row.category +
      '; typical lifetime ' + fmtSeconds(row.typical_s) + '.'));
    detailPanel.appendChild(el('h4', {}, 'The block its sentence speaks for: ' + B.addr[k] + ', ' + fmtBytes(B.size[k])));
    detailPanel.appendChild(blockFacts(k));
    blockStacks(k).forEach(function (e) { detailPanel.appendChild(e); });
    reveal(detailPanel);
  }

  function showModule(r) {
    var row = D.modules[r];
    clear(detailPanel).setAttribute('data-kind', 'module');
    detailPanel.setAttribute('data-id', r);
    detailPanel.appendChild(el('h3', {}, 'Module ' + row.module));
    detailPanel.appendChild(el('p', { 'class': 'module-summary', 'data-bytes': row.at_peak, 'data-count': row.count },
      fmtBytes(row.at_peak) + ' in ' + row.count + ' blocks at the peak' + (row.count ? ', largest first' +
      (row.blocks.length < row.count ? ' (the ' + row.blocks.length + ' largest)' : '') + ':' : '.')));
    if (!row.blocks.length) { reveal(detailPanel); return; }
    var body = el('tbody');
    row.blocks.forEach(function (k) {
      var tr = el('tr', { 'class': 'block-row module-block', 'data-block': k, 'data-id': B.id[k],
        'data-bytes': B.size[k] }, [
        el('td', { 'class': 'num' }, el('button', { type: 'button', 'class': 'linklike' }, fmtBytes(B.size[k]))),
        el('td', {}, D.module_what[B.module_what[k]]), el('td', {}, D.phase_names[B.phase[k]]),
        el('td', {}, siteLabel(B.site[k])),
        el('td', { 'class': 'num' }, B.alloc_t[k] < 0 ? 'before the log' : fmtTime(B.alloc_t[k]))]);
      tr.addEventListener('click', function () { showModuleBlock(r, k); });
      body.appendChild(tr);
    });
    var head = el('tr', {}, ['bytes', 'what', 'phase', 'site', 'allocated'].map(function (h, c) {
      return el('th', c === 0 || c === 4 ? { 'class': 'num' } : {}, h);
    }));
    detailPanel.appendChild(el('table', { 'class': 'module-blocks' }, [el('thead', {}, head), body]));
    reveal(detailPanel);
  }
  function showModuleBlock(r, k) { // the block under the module's list, which stays
    showModule(r);
    [].forEach.call(detailPanel.querySelectorAll('tr.module-block'), function (tr) {
      tr.classList.toggle('selected', +tr.getAttribute('data-block') === k);
    });
    detailPanel.appendChild(el('h4', { 'class': 'module-block-title', 'data-id': B.id[k] },
      'Block ' + B.addr[k] + ', ' + fmtBytes(B.size[k])));
    detailPanel.appendChild(el('p', { 'class': 'reason why' }, D.sentences[B.why[k]]));
    detailPanel.appendChild(blockFacts(k));
    blockStacks(k).forEach(function (e) { detailPanel.appendChild(e); });
  }

  // ---- buttons and the lifetimes table ------------------------------------
  function on(id, f) { var e = document.getElementById(id); if (e) e.addEventListener('click', f); }
  on('btn-peak', function () {
    if (D.peak) selectMoment({ i: D.peak.i, t: D.peak.t, allocated: D.peak.allocated, reserved: D.peak.reserved,
      live: D.peak.live, label: 'the peak' });
  });
  [].forEach.call(document.querySelectorAll('button.btn-oom'), function (b) {
    b.addEventListener('click', function () {
      var n = +b.getAttribute('data-oom'), o = D.ooms[n];
      selectMoment({ i: o.i, t: o.t, allocated: o.allocated, reserved: o.reserved, live: o.live,
        label: 'OOM ' + (n + 1), oom: o });
    });
  });
  on('zoom-in', function () { zoom(0.5, selected && selected.t); });
  on('zoom-out', function () { zoom(2, selected && selected.t); });
  on('zoom-reset', function () { setView(D.xmin, D.xmax); });
  [].forEach.call(document.querySelectorAll('table.lifetimes td[data-lifetime]'), function (td) {
    var r = +td.getAttribute('data-lifetime');
    if (!D.lifetimes[r]) return;
    var b = el('button', { type: 'button', 'class': 'linklike site-link' }, td.textContent);
    clear(td).appendChild(b);
    b.addEventListener('click', function () { showLifetime(r); });
  });
  [].forEach.call(document.querySelectorAll('table.modules td[data-module]'), function (td) {
    var r = +td.getAttribute('data-module');
    if (!D.modules || !D.modules[r]) return;
    var b = el('button', { type: 'button', 'class': 'linklike module-link' }, td.textContent);
    clear(td).appendChild(b);
    b.addEventListener('click', function () { showModule(r); });
  });
  [].forEach.call(document.querySelectorAll('.needs-script'), function (e) { e.hidden = false; });
  svg.setAttribute('tabindex', '0');
  svg.classList.add('interactive');
  render();

  // ---- the test hook ------------------------------------------------------
  function plotPoint(fraction) {
    var r = svg.getBoundingClientRect();
    return { clientX: r.left + (L.left + fraction * PW) * r.width / L.w, clientY: r.top + (L.top + PH / 2) * r.height / L.h,
      bubbles: true, cancelable: true, button: 0 };
  }
  function mouse(type, fraction, dx) {
    var init = plotPoint(fraction);
    init.clientX += dx || 0;
    svg.dispatchEvent(new MouseEvent(type, init));
  }
  function press(e, what) { if (!e) throw new Error('nothing to click for ' + what); e.click(); }
  var TEST_STEPS = {
    'click-peak': function () { press(document.getElementById('btn-peak'), 'click-peak'); },
    'click-oom': function (n) { press(document.querySelectorAll('button.btn-oom')[+n || 0], 'click-oom'); },
    'click-block': function (n) {
      press(document.querySelectorAll('#moment tr.block-row button')[+n || 0], 'click-block');
    },
    'click-first-block': function () { TEST_STEPS['click-block'](0); },
    'click-site': function (n) {
      press(document.querySelectorAll('table.lifetimes button.site-link')[+n || 0], 'click-site');
    },
    'click-module': function (n) {
      press(document.querySelectorAll('table.modules button.module-link')[+n || 0], 'click-module');
    },
    'click-module-block': function (n) {
      press(document.querySelectorAll('#detail tr.module-block button')[+n || 0], 'click-module-block');
    },
    'zoom-in': function () { press(document.getElementById('zoom-in'), 'zoom-in'); },
    'zoom-out': function () { press(document.getElementById('zoom-out'), 'zoom-out'); },
    'zoom-reset': function () { press(document.getElementById('zoom-reset'), 'zoom-reset'); },
    // fractions of the plot's width, as a user's pointer would be
    'click-at': function (f) { mouse('mousedown', +f); mouse('mouseup', +f); },
    'hover-at': function (f) { mouse('mousemove', +f); },
    'wheel-in': function (f) {
      var init = plotPoint(+f);
      init.deltaY = -100;
      svg.dispatchEvent(new WheelEvent('wheel', init));
    },
    'drag': function (f) { mouse('mousedown', 0.5); mouse('mousemove', 0.5, 0); mouse('mousemove', 0.5, +f * PW);
      mouse('mouseup', 0.5, +f * PW); }
  };
  var hook = /[#&]test=([^&]*)/.exec(location.hash);
  if (hook) {
    testing = true;
    var ran = [], trace = []; // the state after each step: the view and the selected moment's event index
    try {
      decodeURIComponent(hook[1]).split(',').forEach(function (step) {
        var parts = step.split(':');
        if (!TEST_STEPS[parts[0]]) throw new Error('unknown test step ' + step);
        TEST_STEPS[parts[0]](parts[1]);
        ran.push(step);
        trace.push({ step: step, v0: view.v0, v1: view.v1, selected: selected ? selected.i : null,
          listed: [].map.call(momentPanel.querySelectorAll('tr.block-row'), function (r) {
            return +r.getAttribute('data-id');
          }) });
      });
    } catch (e) {
      document.body.setAttribute('data-test-error', String(e && e.stack || e));
    }
    document.body.setAttribute('data-test-done', ran.join(','));
    document.body.setAttribute('data-test-trace', JSON.stringify(trace));
  }
})();
