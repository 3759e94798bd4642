"""Stored files: the parse service, the bounded ``file_read`` window and tool, and the knowledge base ingestion."""

from runtime.files._file_read import FileReader, WindowLimits, read_window
from runtime.files._file_tool import file_read_spec, file_tools, spec_tokens
from runtime.files._knowledge import add_files, add_texts, read_documents, split_document
from runtime.files._parse_service import ParseQueue, ParseService
from runtime.files._services import FileServices, open_file_services

__all__ = [
    "FileReader",
    "FileServices",
    "ParseQueue",
    "ParseService",
    "WindowLimits",
    "add_files",
    "add_texts",
    "file_read_spec",
    "file_tools",
    "open_file_services",
    "read_documents",
    "read_window",
    "spec_tokens",
    "split_document",
]
