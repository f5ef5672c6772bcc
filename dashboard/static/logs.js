// A service's Logs page (templates/service_logs.html): the shown attempt's new lines, appended
// without a reload, and a filter over the lines shown.
//
// Following: one request at a time to the panel's data-follow-href (GET …/after?cursor=), which
// answers once new lines come or after about 20 s with none: {"lines": [...], "cursor": "…"}, or
// {"error": {"code", "message"}} for a refusal (shown as the page's error banner; following
// stops). Lines are built with textContent, never parsed as HTML. Bounded: nothing is asked while
// the page is hidden, errors back off up to a minute, and following stops after MAX_NEW_LINES.
(function () {
  'use strict';

  // the first pause after an error, doubled on each error in a row
  var RETRY_MS = 2000;
  var MAX_RETRY_MS = 60000;
  // an answer without lines that came back sooner than this is not asked again before it has passed
  var QUICK_MS = 1000;
  // new lines appended before the page stops following (a reload reads on)
  var MAX_NEW_LINES = 50000;
  var BADGES = { stderr: ['pill-error', 'stderr'], loss: ['pill-warn', 'lost'], notice: ['pill-info', 'notice'] };
  var LEVELS = { stdout: 'info', stderr: 'error', loss: 'warning', notice: 'notice' };

  function start() {
    var panel = document.getElementById('logs-panel');
    var list = document.getElementById('log-lines');
    if (!panel || !list) {
      return;
    }
    var search = document.getElementById('logs-search');
    var matches = document.getElementById('logs-matches');
    var follow = document.getElementById('logs-follow');
    var empty = document.getElementById('logs-no-lines');
    var banner = document.getElementById('logs-follow-error');

    // ---- the filter: a case-insensitive substring of the line's text; losses and notices stay

    function textOf(row) {
      var text = row.querySelector('.log-text');
      return text ? text.textContent.toLowerCase() : '';
    }

    function isLine(row) {
      return row.dataset.kind === 'stdout' || row.dataset.kind === 'stderr';
    }

    function show(row, needle) {
      row.hidden = needle !== '' && isLine(row) && textOf(row).indexOf(needle) < 0;
    }

    function count() {
      var needle = search ? search.value.trim().toLowerCase() : '';
      var total = 0;
      var shown = 0;
      var rows = list.children;
      for (var i = 0; i < rows.length; i++) {
        if (isLine(rows[i])) {
          total += 1;
          if (!rows[i].hidden) {
            shown += 1;
          }
        }
      }
      if (matches) {
        var lines = total === 1 ? ' line' : ' lines';
        matches.textContent = needle === '' ? total + lines : shown + ' of ' + total + lines + ' match';
      }
    }

    function filter() {
      var needle = search.value.trim().toLowerCase();
      var rows = list.children;
      for (var i = 0; i < rows.length; i++) {
        show(rows[i], needle);
      }
      count();
    }

    if (search) {
      search.addEventListener('input', filter);
    }

    // ---- the rows, as the template renders them

    function row(line) {
      var li = document.createElement('li');
      li.className = 'log-line log-' + (LEVELS[line.kind] || 'notice');
      li.dataset.kind = line.kind;
      var time = document.createElement('time');
      time.className = 'log-time';
      if (line.ts) {
        time.dateTime = line.ts;
        time.title = line.ts;
      }
      time.textContent = line.at || '';
      li.appendChild(time);
      var badge = document.createElement('span');
      badge.className = 'log-badge';
      if (BADGES[line.kind]) {
        var pill = document.createElement('span');
        pill.className = 'pill badge ' + BADGES[line.kind][0];
        pill.textContent = BADGES[line.kind][1];
        badge.appendChild(pill);
      }
      li.appendChild(badge);
      var text = document.createElement('span');
      text.className = 'log-text';
      text.textContent = line.text || '';
      li.appendChild(text);
      if (line.cut) {
        var cut = document.createElement('span');
        cut.className = 'pill pill-warn badge log-cut';
        cut.textContent = line.cut + ' bytes cut';
        li.appendChild(cut);
      }
      return li;
    }

    var appended = 0;

    function append(lines) {
      if (!lines.length) {
        return;
      }
      // keep the newest line in view when the reader was at the bottom
      var atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
      var needle = search ? search.value.trim().toLowerCase() : '';
      var fragment = document.createDocumentFragment();
      lines.forEach(function (line) {
        var li = row(line);
        show(li, needle);
        fragment.appendChild(li);
        if (isLine(li)) {
          appended += 1;
          if (empty) {
            empty.hidden = true;
          }
        }
      });
      list.appendChild(fragment);
      if (atBottom) {
        list.scrollTop = list.scrollHeight;
      }
      count();
    }

    // ---- following

    var href = panel.dataset.followHref;
    var cursor = panel.dataset.cursor || '';
    var stopped = !href;
    var asking = null;
    var timer = null;
    var failures = 0;

    function state(name, text) {
      if (follow) {
        follow.dataset.state = name;
        follow.textContent = text;
      }
    }

    function stop(text) {
      stopped = true;
      clearTimeout(timer);
      state('stopped', text);
    }

    function refused(error) {
      stop('Not following');
      if (banner) {
        banner.dataset.code = String(error.code || '');
        banner.querySelector('strong').textContent = 'New lines cannot be read (' + (error.code || 'error') + ')';
        banner.querySelector('span').textContent = String(error.message || '') + '. Reload the page to try again.';
        banner.hidden = false;
      }
    }

    function later(ms) {
      clearTimeout(timer);
      timer = setTimeout(ask, ms);
    }

    function retry() {
      failures += 1;
      state('retrying', 'Retrying');
      later(Math.min(RETRY_MS * Math.pow(2, failures - 1), MAX_RETRY_MS));
    }

    function answered(status, body, askedAt) {
      if (status === 200 && body && Array.isArray(body.lines)) {
        failures = 0;
        state('following', 'Following');
        append(body.lines);
        if (typeof body.cursor === 'string' && body.cursor !== '') {
          cursor = body.cursor;
          panel.dataset.cursor = cursor;
        }
        if (appended >= MAX_NEW_LINES) {
          stop('Stopped: reload to read on');
          return;
        }
        var quick = body.lines.length === 0 && Date.now() - askedAt < QUICK_MS;
        later(quick ? QUICK_MS : 0);
      } else if (body && body.error && status >= 400 && status < 500 && status !== 429) {
        refused(body.error);
      } else {
        retry();
      }
    }

    function ask() {
      timer = null;
      if (stopped || asking || document.hidden) {
        return;
      }
      // the request in flight; an answer to one the page let go of (hidden meanwhile) is dropped
      var mine = { controller: typeof AbortController === 'function' ? new AbortController() : null };
      asking = mine;
      var askedAt = Date.now();
      var url = href + '?cursor=' + encodeURIComponent(cursor);
      var options = { headers: { accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' };
      if (mine.controller) {
        options.signal = mine.controller.signal;
      }
      fetch(url, options)
        .then(function (response) {
          if (response.redirected) {
            // no session any more: the login page answered
            return { status: 401, body: { error: { code: 'unauthenticated', message: 'Your session ended' } } };
          }
          return response.json().then(
            function (body) { return { status: response.status, body: body }; },
            function () { return { status: response.status, body: null }; }
          );
        })
        .then(function (answer) {
          if (asking === mine) {
            asking = null;
            answered(answer.status, answer.body, askedAt);
          }
        })
        .catch(function () {
          if (asking === mine) {
            asking = null;
            retry();
          }
        });
    }

    // a hidden page asks for nothing; shown again, it reads on from its cursor
    document.addEventListener('visibilitychange', function () {
      if (stopped) {
        return;
      }
      if (document.hidden) {
        clearTimeout(timer);
        if (asking && asking.controller) {
          asking.controller.abort();
        }
        asking = null;
        state('paused', 'Paused while hidden');
      } else {
        state('following', 'Following');
        later(0);
      }
    });

    // the newest lines in view, then follow
    list.scrollTop = list.scrollHeight;
    if (!stopped) {
      later(0);
    }
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
