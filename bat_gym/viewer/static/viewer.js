// bat-gym view: filtering and sorting of tables, and evidence links that scroll to
// their call. Plain script, no build step, no network; pages work without it too.
(function () {
  "use strict";

  function cellValue(row, index) {
    var cell = row.children[index];
    if (!cell) return "";
    var v = cell.getAttribute("data-v");
    return v === null ? cell.textContent.trim() : v;
  }

  function sortTable(table, index, numeric) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var dir = table.getAttribute("data-sort") === index + "+" ? -1 : 1;
    rows.sort(function (a, b) {
      var x = cellValue(a, index), y = cellValue(b, index);
      if (numeric) {
        x = x === "" ? -1 : parseFloat(x); y = y === "" ? -1 : parseFloat(y);
        return (x - y) * dir;
      }
      return x.localeCompare(y) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    table.setAttribute("data-sort", index + (dir === 1 ? "+" : "-"));
  }

  function applyFilters(table) {
    var form = document.getElementById(table.getAttribute("data-filters"));
    if (!form) return;
    var controls = form.querySelectorAll("[data-filter]");
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var ok = true;
      Array.prototype.forEach.call(controls, function (c) {
        var want = c.value, key = c.getAttribute("data-filter");
        if (!want) return;
        var have = row.getAttribute("data-" + key) || "";
        if (key === "min-reward") {
          ok = ok && have !== "" && parseFloat(have) >= parseFloat(want);
        } else if (key === "max-reward") {
          ok = ok && have !== "" && parseFloat(have) <= parseFloat(want);
        } else {
          ok = ok && (" " + have + " ").indexOf(" " + want + " ") >= 0;
        }
      });
      row.classList.toggle("hidden", !ok);
      if (ok) shown += 1;
    });
    var count = form.querySelector(".count");
    if (count) count.textContent = shown + " shown";
  }

  function flash(id) {
    var el = document.getElementById(id);
    if (!el) return;
    var closed = el.closest("details");
    if (closed) closed.open = true;
    el.scrollIntoView({ block: "center" });
    el.classList.add("flash");
    window.setTimeout(function () { el.classList.remove("flash"); }, 1600);
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
        if (!th.classList.contains("sortable")) return;
        th.addEventListener("click", function () {
          sortTable(table, i, th.classList.contains("num"));
        });
      });
      if (table.getAttribute("data-filters")) {
        var form = document.getElementById(table.getAttribute("data-filters"));
        form.addEventListener("input", function () { applyFilters(table); });
        form.addEventListener("change", function () { applyFilters(table); });
        applyFilters(table);
      }
    });
    Array.prototype.forEach.call(document.querySelectorAll("a.evidence"), function (a) {
      a.addEventListener("click", function (ev) {
        var id = a.getAttribute("href").slice(1);
        if (!document.getElementById(id)) return;
        ev.preventDefault();
        history.replaceState(null, "", "#" + id);
        flash(id);
      });
    });
    if (location.hash.length > 1) flash(location.hash.slice(1));
  });
})();
