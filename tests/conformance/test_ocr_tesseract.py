"""The shipped OCR connector speaks MCP to any client: the SDK's own client calls ocr/v1's tool.

Its conformance to ocr/v1 through the router is `test_check.test_ocr_tesseract_implements_ocr_v1`.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/ocr-tesseract"
FIXTURES = REPO / "catalog/interfaces/ocr/v1/conformance"


def server() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(CONNECTOR / "main.py")], cwd=str(CONNECTOR),
                                 env={"OCR_LANGUAGES": "eng", "PATH": "/usr/bin:/bin"})


@pytest.mark.skipif(not (shutil.which("tesseract") and shutil.which("pdftoppm")),
                    reason="tesseract-ocr and poppler-utils are not installed (.ci/run installs them)")
def test_it_reads_a_pdf_into_pages_and_blocks_and_refuses_a_zip() -> None:
    async def calls() -> tuple[Any, Any]:
        async with Client(server()) as client:
            pdf = await client.call_tool("ocr_extract", {"path": str(FIXTURES / "invoice.pdf")})
            zipped = await client.call_tool("ocr_extract", {"path": str(FIXTURES / "archive.zip")})
            return pdf, zipped

    pdf, zipped = asyncio.run(asyncio.wait_for(calls(), 60))
    page = pdf.structured_content["pages"][0]
    assert "INV-2024-0042" in page["text"]
    assert any("Total" in block["text"] for block in page["blocks"])
    assert all(len(block["bbox"]) == 4 and block["bbox"][0] < block["bbox"][2] for block in page["blocks"])
    assert zipped.is_error
    assert zipped.structured_content["error"] == "unsupported_format"
