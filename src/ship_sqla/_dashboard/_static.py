"""The dashboard's two static assets: its stylesheet and the live-update poll (issue 25).

They are files of their own, served by the dashboard at ``<base>/static/<name>``, so the pages
carry no inline ``<style>``, ``style=`` attribute or ``<script>`` and the Content-Security-Policy
(:mod:`._security`) can allow styles and scripts from the dashboard's own origin only
(``'self'``), with no ``'unsafe-inline'``, nonce or hash. The poll reads its period from the
``data-poll-ms`` attribute of ``<main>``: a page without it does not poll.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ASSETS", "SCRIPT", "STYLESHEET"]

STYLESHEET: Final = "dashboard.css"
SCRIPT: Final = "poll.js"

_CSS: Final = """\
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#cfd8dc;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .who{margin-left:auto}
main{padding:16px}table{border-collapse:collapse;width:100%;background:#fff;margin:8px 0}
th,td{border-bottom:1px solid #e0e0e0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}pre{background:#f5f5f5;padding:8px;overflow:auto;max-height:320px}
.flash{background:#e8f5e9;border:1px solid #a5d6a7;padding:6px 10px}
.error{background:#ffebee;border:1px solid #ef9a9a;padding:6px 10px}
.banner ul{margin:4px 0 0;padding-left:18px}
.state-dead{color:#c62828}.state-completed{color:#2e7d32}.state-running{color:#1565c0}
form.inline{display:inline}button{margin:2px}.muted{color:#777}
.filters label{margin-right:8px}.timeline li{margin-bottom:8px}
"""

_POLL: Final = """\
"use strict";
// Live update (overview, workers): every data-poll-ms milliseconds, fetch this page's
// fragment (X-Ship-Fragment: 1) and replace <main>'s content with it; a failed fetch keeps
// the page as it is. Pages with forms carry no data-poll-ms, so a selection is never lost.
(function () {
  var main = document.querySelector("main[data-poll-ms]");
  if (main === null) {
    return;
  }
  var every = parseInt(main.getAttribute("data-poll-ms"), 10);
  if (!(every > 0)) {
    return;
  }
  setInterval(function () {
    fetch(location.href, {
      headers: { "X-Ship-Fragment": "1" },
      credentials: "same-origin",
      cache: "no-store",
    })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          main.innerHTML = html;
        }
      })
      .catch(function () {});
  }, every);
})();
"""

ASSETS: Final[dict[str, tuple[bytes, str]]] = {
    STYLESHEET: (_CSS.encode(), "text/css; charset=utf-8"),
    SCRIPT: (_POLL.encode(), "text/javascript; charset=utf-8"),
}
"""Asset name -> (body, Content-Type): exact types, as ``X-Content-Type-Options: nosniff``
makes the browser refuse a script or stylesheet served under any other."""
