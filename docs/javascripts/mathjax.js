// MathJax 3 reads `\(...\)` (the API pages, via pymdownx.arithmatex) and `$...$` (the
// tutorials' notebook cells) inline, and `\[...\]` / `$$...$$` as display maths.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
  },
};
