"""Reports: run directories, summary.md, a self-contained report.html."""
