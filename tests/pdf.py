"""Minimal valid PDFs for tests, written by hand (offsets computed here), one line of text a page."""

from __future__ import annotations


def make_pdf(pages: list[str], title: str | None = None) -> bytes:
    """A minimal valid PDF with one line of Helvetica text per page, offsets computed by hand."""
    first_page = 4
    kids = " ".join(f"{first_page + 2 * i} 0 R" for i in range(len(pages)))
    objects = {
        1: "<< /Type /Catalog /Pages 2 0 R >>",
        2: f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>",
        3: "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    }
    for i, text in enumerate(pages):
        page, content = first_page + 2 * i, first_page + 2 * i + 1
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 11 Tf 40 750 Td ({escaped}) Tj ET"
        objects[page] = (
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {content} 0 R >>"
        )
        objects[content] = f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream"
    info = len(objects) + 1
    objects[info] = f"<< /Title ({title}) >>" if title else "<< >>"
    data = b"%PDF-1.4\n"
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(data)
        data += f"{number} 0 obj\n{objects[number]}\nendobj\n".encode("latin-1")
    xref = len(data)
    data += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    data += "".join(f"{offsets[n]:010d} 00000 n \n" for n in sorted(objects)).encode()
    data += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info {info} 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return data
