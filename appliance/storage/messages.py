"""SMS conversations and their messages, messages of no lead (orphans), and opt-outs."""

from __future__ import annotations

from dataclasses import astuple, dataclass

import apsw



@dataclass(frozen=True)
class Conversation:
    interaction_id: str
    lead_id: str
    sender: str
    recipient: str
    status: str
    message_count: int
    created_at: str
    updated_at: str


_CONVERSATION_COLUMNS = "interaction_id, lead_id, sender, recipient, status, message_count, created_at, updated_at"


@dataclass(frozen=True)
class Message:
    message_id: str
    interaction_id: str
    lead_id: str
    direction: str
    sender: str
    recipient: str
    body: str
    encoding: str
    segments: int
    provider_id: str | None
    provider_type: str
    provider_message_id: str | None
    provider_status: str | None
    status: str
    reason: str | None
    created_at: str
    updated_at: str


_MESSAGE_COLUMNS = ("message_id, interaction_id, lead_id, direction, sender, recipient, body, encoding, segments,"
                    " provider_id, provider_type, provider_message_id, provider_status, status, reason,"
                    " created_at, updated_at")


@dataclass(frozen=True)
class OrphanMessage:
    """An inbound message from a number no lead of the tenant has (or the HELP answer to one)."""

    message_id: str
    direction: str
    sender: str
    recipient: str
    body: str
    provider_id: str | None
    provider_type: str
    provider_message_id: str | None
    status: str
    created_at: str


_ORPHAN_COLUMNS = ("message_id, direction, sender, recipient, body, provider_id, provider_type, provider_message_id,"
                   " status, created_at")


class Messages:
    """SMS conversations and their messages, orphan messages and opt-outs."""

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def get_conversation(self, tenant_id: str, interaction_id: str) -> Conversation | None:
        found = self._conn.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM sms_conversations WHERE interaction_id = ? AND tenant_id = ?",
            (interaction_id, tenant_id)).fetchone()
        return Conversation(*found) if found else None

    def open_conversation(self, tenant_id: str, lead_id: str, sender: str) -> Conversation | None:
        """The most recent open conversation of the lead from `sender`."""
        found = self._conn.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM sms_conversations"
            " WHERE tenant_id = ? AND lead_id = ? AND sender = ? AND status = 'open'"
            " ORDER BY created_at DESC, interaction_id DESC LIMIT 1",
            (tenant_id, lead_id, sender)).fetchone()
        return Conversation(*found) if found else None

    def insert_conversation(self, tenant_id: str, conversation: Conversation) -> None:
        self._conn.execute(
            f"INSERT INTO sms_conversations(tenant_id, {_CONVERSATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (tenant_id, *astuple(conversation)))

    def count_message(self, interaction_id: str, now: str) -> None:
        self._conn.execute("UPDATE sms_conversations SET message_count = message_count + 1, updated_at = ?"
                           " WHERE interaction_id = ?", (now, interaction_id))

    def insert_message(self, tenant_id: str, message: Message) -> None:
        marks = ", ".join("?" * (len(astuple(message)) + 1))
        self._conn.execute(f"INSERT INTO sms_messages(tenant_id, {_MESSAGE_COLUMNS}) VALUES ({marks})",
                           (tenant_id, *astuple(message)))

    def finish_message(self, tenant_id: str, message_id: str, *, status: str,
                       provider_message_id: str | None, provider_status: str | None, reason: str | None,
                       now: str) -> None:
        self._conn.execute(
            "UPDATE sms_messages SET status = ?, provider_message_id = ?, provider_status = ?, reason = ?,"
            " updated_at = ? WHERE message_id = ? AND tenant_id = ?",
            (status, provider_message_id, provider_status, reason, now, message_id, tenant_id))

    def get_message(self, tenant_id: str, message_id: str) -> Message | None:
        found = self._conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM sms_messages WHERE message_id = ? AND tenant_id = ?",
                                   (message_id, tenant_id)).fetchone()
        return Message(*found) if found else None

    def messages_of(self, tenant_id: str, interaction_id: str) -> list[Message]:
        return [Message(*row) for row in self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM sms_messages WHERE interaction_id = ? AND tenant_id = ?"
            " ORDER BY message_id", (interaction_id, tenant_id))]

    def lead_messages(self, tenant_id: str, lead_id: str, before: str | None, limit: int) -> list[Message]:
        """The lead's messages, every conversation, newest first, below the id `before` when given."""
        return [Message(*row) for row in self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM sms_messages WHERE tenant_id = ? AND lead_id = ? AND message_id < ?"
            " ORDER BY message_id DESC LIMIT ?", (tenant_id, lead_id, before if before is not None else "\uffff", limit))]

    def settle_interrupted(self, started_before: str, reason: str, now: str) -> int:
        """Messages still `sending` that were handed to a provider before `started_before`: the
        process stopped during the call (a crash) or the call never ended. They become `error`, so no
        message stays `sending` forever; a call that does end later still records its real status.
        HELP answers to orphan messages too (sent after the webhook's answer: a process that stops
        then leaves them `sending`)."""
        self._conn.execute("UPDATE sms_messages SET status = 'error', reason = ?, updated_at = ?"
                           " WHERE status = 'sending' AND created_at < ?", (reason, now, started_before))
        settled = self._conn.changes()
        self._conn.execute("UPDATE sms_orphan_messages SET status = 'error'"
                           " WHERE status = 'sending' AND created_at < ?", (started_before,))
        return settled + self._conn.changes()

    # ---- two-way: delivery reports, replies, orphans --------------------------------------------

    def by_provider_id(self, tenant_id: str, provider_type: str, provider_message_id: str,
                       direction: str) -> Message | None:
        found = self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM sms_messages WHERE tenant_id = ? AND provider_type = ?"
            " AND provider_message_id = ? AND direction = ? LIMIT 1",
            (tenant_id, provider_type, provider_message_id, direction)).fetchone()
        return Message(*found) if found else None

    def report_status(self, tenant_id: str, message_id: str, *, status: str, provider_status: str | None,
                      reason: str | None, now: str) -> None:
        """A delivery report: the status moves, the reason stays when the report gives none."""
        self._conn.execute(
            "UPDATE sms_messages SET status = ?, provider_status = ?, reason = coalesce(?, reason), updated_at = ?"
            " WHERE message_id = ? AND tenant_id = ?", (status, provider_status, reason, now, message_id, tenant_id))

    def insert_orphan(self, tenant_id: str, message: OrphanMessage) -> None:
        self._conn.execute(f"INSERT INTO sms_orphan_messages(tenant_id, {_ORPHAN_COLUMNS})"
                           " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (tenant_id, *astuple(message)))

    def orphan_exists(self, tenant_id: str, provider_type: str, provider_message_id: str) -> bool:
        return self._conn.execute(
            "SELECT 1 FROM sms_orphan_messages WHERE tenant_id = ? AND provider_type = ? AND provider_message_id = ?",
            (tenant_id, provider_type, provider_message_id)).fetchone() is not None

    def orphans(self, tenant_id: str, before: str | None, limit: int) -> list[OrphanMessage]:
        """The tenant's orphan messages, newest first, below the id `before` when given."""
        return [OrphanMessage(*row) for row in self._conn.execute(
            f"SELECT {_ORPHAN_COLUMNS} FROM sms_orphan_messages WHERE tenant_id = ? AND message_id < ?"
            " ORDER BY message_id DESC LIMIT ?", (tenant_id, before if before is not None else "\uffff", limit))]

    def finish_orphan(self, tenant_id: str, message_id: str, status: str, provider_message_id: str | None) -> None:
        self._conn.execute("UPDATE sms_orphan_messages SET status = ?, provider_message_id = ?"
                           " WHERE message_id = ? AND tenant_id = ?",
                           (status, provider_message_id, message_id, tenant_id))

    def sends_from(self, tenant_id: str, number: str) -> bool:
        """Whether any conversation of the tenant was opened from `number`."""
        return self._conn.execute("SELECT 1 FROM sms_conversations WHERE tenant_id = ? AND sender = ? LIMIT 1",
                                  (tenant_id, number)).fetchone() is not None

    # ---- opt-outs (digests of E.164 phones, appliance/domain/suppression.phone_hash) ------------

    def opt_out(self, tenant_id: str, digest: bytes, keyword: str, now: str) -> None:
        """Opts the phone out; one already out keeps its first date."""
        self._conn.execute("INSERT INTO sms_opt_outs(tenant_id, hash, keyword, since) VALUES (?, ?, ?, ?)"
                           " ON CONFLICT (tenant_id, hash) DO NOTHING", (tenant_id, digest, keyword, now))

    def opt_in(self, tenant_id: str, digest: bytes) -> None:
        self._conn.execute("DELETE FROM sms_opt_outs WHERE tenant_id = ? AND hash = ?", (tenant_id, digest))

    def opted_out_since(self, tenant_id: str, digest: bytes) -> str | None:
        found = self._conn.execute("SELECT since FROM sms_opt_outs WHERE tenant_id = ? AND hash = ?",
                                   (tenant_id, digest)).fetchone()
        return found[0] if found else None
