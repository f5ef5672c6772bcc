// Live updates over the socket: a page holding the live element (#live, templates/live.html)
// opens one session on /api/v1/socket (kind "dashboard", protocol capstan-socket/1). The
// browser sends its HttpOnly session cookie with the upgrade and the host takes it as the
// session's bearer (from this host's own pages only), so no token is ever handed to script.
//
// Over the session the page
// - waits for changes with `events.watch` calls — the long-poll's own method and cadence
//   (answered when an event of the page's areas commits, or after 25 s), as call frames over
//   the socket instead of HTTP requests; a change fires `capstan-changed` on the body, on
//   which the page's panels re-fetch themselves;
// - refreshes the same way on any push whose topic starts with one of its areas
//   (`relay.config` on a cluster page).
//
// A fold marked data-keep-open that the person opened stays open across those refreshes.
//
// The long-poll (GET /live/wait, htmx on the same element) stays the fallback, started only
// when the socket cannot serve the page: a proxy that does not pass WebSocket upgrades, a
// browser without WebSocket, a session refused or anonymous (the cookie no longer
// authenticates — the poll then takes the page to the login page), or a socket that keeps
// closing. A page is never left without updates.
(function () {
  'use strict';

  var PROTOCOL = 'capstan-socket/1';
  // how long the upgrade and the welcome may take before the page falls back
  var OPEN_WAIT_MS = 10000;
  // the pause after an error, as the long-poll's
  var RETRY_MS = 5000;
  // reconnections in a row that never reach a welcome before the page falls back
  var MAX_RETRIES = 3;
  // pushes and answers within this window refresh the panels once
  var REFRESH_DEBOUNCE_MS = 200;

  function start() {
    var live = document.getElementById('live');
    if (!live || live.dataset.socket === 'polling') {
      return;
    }
    var areas = (live.dataset.areas || '').split(',').filter(function (a) { return a !== ''; });
    var head = Number(live.dataset.head) || 0;
    var ws = null;
    var fellBack = false;
    var welcomed = false;
    var failures = 0;
    var calls = 0;
    var watching = null;
    var refreshTimer = null;

    // 'connecting', 'connected' (a welcomed, authenticated session) or 'polling' (the fallback)
    function status(state) {
      live.dataset.socket = state;
      live.title = state === 'connected'
        ? 'This page updates itself when something changes (socket session)'
        : 'This page updates itself when something changes';
    }

    function refresh() {
      if (refreshTimer !== null) {
        return;
      }
      refreshTimer = setTimeout(function () {
        refreshTimer = null;
        if (window.htmx) {
          window.htmx.trigger(document.body, 'capstan-changed');
        }
      }, REFRESH_DEBOUNCE_MS);
    }

    function fallBack() {
      if (fellBack) {
        return;
      }
      fellBack = true;
      status('polling');
      if (ws) {
        try { ws.close(1000); } catch (e) { /* already closing */ }
      }
      if (window.htmx) {
        window.htmx.trigger(live, 'capstan-poll');
      }
    }

    function send(frame) {
      if (ws && ws.readyState === WebSocket.OPEN) {
        ws.send(JSON.stringify(frame));
        return true;
      }
      return false;
    }

    // One events.watch at a time, from the head the page last saw.
    function watch() {
      if (fellBack || !welcomed) {
        return;
      }
      calls += 1;
      watching = 'watch-' + calls;
      send({ type: 'call', id: watching, method: 'events.watch', body: { after: head, areas: areas } });
    }

    function answered(frame) {
      watching = null;
      if (frame.type === 'error') {
        var code = frame.error && frame.error.code;
        if (code === 'unauthenticated' || code === 'forbidden') {
          // the session no longer stands for anyone: the long-poll leads to the login page
          fallBack();
        } else {
          setTimeout(watch, RETRY_MS);
        }
        return;
      }
      var answer = frame.result || {};
      if (typeof answer.head === 'number') {
        head = answer.head;
        live.dataset.head = String(head);
      }
      if (answer.changed === true) {
        refresh();
      }
      watch();
    }

    function open() {
      status('connecting');
      welcomed = false;
      var scheme = window.location.protocol === 'https:' ? 'wss:' : 'ws:';
      try {
        ws = new WebSocket(scheme + '//' + window.location.host + '/api/v1/socket');
      } catch (e) {
        fallBack();
        return;
      }
      var socket = ws;
      var timer = setTimeout(function () {
        if (!welcomed && socket === ws) {
          fallBack();
        }
      }, OPEN_WAIT_MS);
      socket.onopen = function () {
        socket.send(JSON.stringify({ type: 'offer', kind: 'dashboard', protocols: [PROTOCOL] }));
      };
      socket.onmessage = function (event) {
        var frame;
        try {
          frame = JSON.parse(event.data);
        } catch (e) {
          return;
        }
        if (!frame || typeof frame !== 'object') {
          return;
        }
        if (frame.type === 'welcome') {
          clearTimeout(timer);
          if (!frame.identity) {
            fallBack();
            return;
          }
          welcomed = true;
          failures = 0;
          live.dataset.sessionId = String(frame.sessionId || '');
          status('connected');
          watch();
        } else if ((frame.type === 'result' || frame.type === 'error') && frame.id !== null && frame.id === watching) {
          answered(frame);
        } else if (frame.type === 'push') {
          var area = String(frame.topic || '').split('.')[0];
          if (areas.indexOf(area) >= 0) {
            refresh();
          }
        }
      };
      socket.onclose = function () {
        clearTimeout(timer);
        if (fellBack || socket !== ws) {
          return;
        }
        var wasWelcomed = welcomed;
        welcomed = false;
        watching = null;
        failures += 1;
        if (!wasWelcomed && failures > MAX_RETRIES) {
          fallBack();
          return;
        }
        if (!wasWelcomed && failures === 1) {
          // the very first open failed: a proxy or a refusal, not a blip — poll instead
          fallBack();
          return;
        }
        status('connecting');
        setTimeout(open, RETRY_MS * Math.min(failures, MAX_RETRIES));
      };
    }

    if (typeof window.WebSocket !== 'function') {
      fallBack();
      return;
    }
    open();
  }

  // A fold the person opened (<details data-keep-open id=…>, a replica's history on the Runtime
  // card) stays open when its panel is re-fetched: the open ones are remembered by id and
  // opened again in what htmx swaps in.
  var opened = {};
  document.addEventListener('toggle', function (event) {
    var fold = event.target;
    if (fold && fold.tagName === 'DETAILS' && fold.id && fold.hasAttribute('data-keep-open')) {
      if (fold.open) {
        opened[fold.id] = true;
      } else {
        delete opened[fold.id];
      }
    }
  }, true);
  document.addEventListener('htmx:load', function (event) {
    var root = event.detail && event.detail.elt;
    if (!root || typeof root.querySelectorAll !== 'function') {
      return;
    }
    root.querySelectorAll('details[data-keep-open][id]').forEach(function (fold) {
      if (opened[fold.id]) {
        fold.open = true;
      }
    });
  });

  // after htmx has processed the page (its own listener was added first)
  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
