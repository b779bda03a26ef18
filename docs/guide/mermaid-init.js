// Draws the guide's ```mermaid blocks. mdBook renders each one as
// <pre><code class="language-mermaid">...</code></pre>; this replaces each
// with a <div class="mermaid"> holding the same text and has mermaid draw
// them. mermaid.min.js, loaded just before this file, is a copy of the npm
// package's that scripts/guide.sh puts next to book.toml: the page needs
// no network.
(function () {
  "use strict";

  function darkTheme() {
    var classes = document.documentElement.classList;
    return ["coal", "navy", "ayu"].some(function (name) {
      return classes.contains(name);
    });
  }

  function draw() {
    var blocks = document.querySelectorAll("code.language-mermaid");
    if (blocks.length === 0) {
      return;
    }
    if (typeof mermaid === "undefined") {
      console.warn("mermaid.min.js is missing: build the guide with scripts/guide.sh");
      return;
    }
    blocks.forEach(function (code) {
      var pre = code.closest("pre") || code;
      var diagram = document.createElement("div");
      diagram.className = "mermaid";
      // textContent: the diagram's source, whatever highlighting did to it.
      diagram.textContent = code.textContent;
      pre.replaceWith(diagram);
    });
    mermaid.initialize({
      startOnLoad: false,
      securityLevel: "strict",
      theme: darkTheme() ? "dark" : "default",
    });
    mermaid.run({ querySelector: "div.mermaid" });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
