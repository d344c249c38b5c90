"""Summaries (docs/design.md §6): the prompt and its nonce fence (``prompt``, ``fence``), the
transcript the summarizer reads (``transcript``), validation of a reply (``validate``), the
retention check for identifiers (``retention``), the user's own words kept verbatim
(``verbatim``), preserved tool outputs (``preserved``), the offline summarizer
(``offline``), and the summarizer that ties them to a model (``summarize``, ``build``)."""
