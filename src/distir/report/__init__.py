"""Reports: error messages, summaries, tables and the demo tour."""
