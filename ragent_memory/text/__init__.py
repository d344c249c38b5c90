"""Text as recall and the extractors read it (docs/design.md §9, §9b): words, stems
(``porter``), search terms with CJK bigrams (``terms``), relative time anchored to a date
(``relative``), and a bounded memo of derived text (``memo``)."""
