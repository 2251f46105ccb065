"""Notes as a model without tools gets them: what the thing is, never a call to make."""

from __future__ import annotations

from daemon.context.toolless import plain_lines, plain_note


def test_a_pasted_file_keeps_what_it_is_and_loses_the_call() -> None:
    note = ('[file: message.txt, text/plain, 9.0 KB, 212 lines, stored at '
            'attachments/2026-12/01J.txt; read it with file_read("attachments/2026-12/01J.txt",'
            ' 1, 100)]')
    assert plain_note(note) == ("[file: message.txt, text/plain, 9.0 KB, 212 lines, stored at "
                                "attachments/2026-12/01J.txt]")


def test_a_document_keeps_its_description_up_to_the_colon() -> None:
    note = ('[document: report.pdf, application/pdf, 1.2 MB, stored at attachments/r.pdf; a PDF'
            ' of 12 pages titled "Q3": pdf_info("attachments/r.pdf"), pdf_read("attachments/'
            'r.pdf", 1, 5) and pdf_search("attachments/r.pdf", "words") read it a page range at'
            ' a time (tool_activate("documents") loads them)]')
    assert plain_note(note) == ('[document: report.pdf, application/pdf, 1.2 MB, stored at '
                                'attachments/r.pdf; a PDF of 12 pages titled "Q3"]')


def test_a_facts_line_loses_its_pointer_and_keeps_the_facts() -> None:
    assert plain_note("[Facts changed since this conversation began: now kept: cat is Pickle; "
                      "lives in Lisbon ... (more: memory_search finds them)]") == (
        "[Facts changed since this conversation began: now kept: cat is Pickle; "
        "lives in Lisbon ...]")
    block = "<user_facts>\n- 2026-12-01: cat is Pickle\n[3 older facts not shown; " \
            "memory_search finds them]\n</user_facts>"
    assert plain_lines(block) == ("<user_facts>\n- 2026-12-01: cat is Pickle\n"
                                  "[3 older facts not shown]\n</user_facts>")


def test_a_note_without_tool_words_is_the_same_bytes() -> None:
    note = "[voice: note.ogg, audio/ogg, 12 KB, stored at attachments/n.ogg; transcribed above]"
    assert plain_note(note) is note
