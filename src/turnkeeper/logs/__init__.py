"""Logs: the EventLog interface, its stores (memory, JSON Lines, SQLite, PostgreSQL), the
SharedLog capability of a log many workers share, and JSON Lines files."""

from turnkeeper.logs._jsonl import (
    JsonlRead,
    TornTail,
    check_sequence,
    decode_jsonl,
    encode_jsonl,
    read_jsonl,
    write_jsonl,
)
from turnkeeper.logs._jsonl_log import JsonlLog
from turnkeeper.logs._log import LARGEST_SEQ, Batch, EventLog, SeqConflict, check_batch
from turnkeeper.logs._memory_log import MemoryLog
from turnkeeper.logs._postgres_log import PostgresLog, is_postgres_url
from turnkeeper.logs._shared import Claim, Consumed, FenceLost, InboxItem, Posted, SharedLog
from turnkeeper.logs._sqlite_file import StoredChain
from turnkeeper.logs._sqlite_log import SqliteLog

__all__ = [
    "LARGEST_SEQ",
    "Batch",
    "Claim",
    "Consumed",
    "EventLog",
    "FenceLost",
    "InboxItem",
    "JsonlLog",
    "JsonlRead",
    "MemoryLog",
    "Posted",
    "PostgresLog",
    "SeqConflict",
    "SharedLog",
    "SqliteLog",
    "StoredChain",
    "TornTail",
    "check_batch",
    "check_sequence",
    "decode_jsonl",
    "encode_jsonl",
    "is_postgres_url",
    "read_jsonl",
    "write_jsonl",
]
