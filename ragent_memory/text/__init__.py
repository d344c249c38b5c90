"""Text as recall and the extractors read it (docs/design.md §9, §9b): words, stems
(``porter``), search terms with CJK bigrams (``terms``), and relative time anchored to a date
(``relative``)."""
