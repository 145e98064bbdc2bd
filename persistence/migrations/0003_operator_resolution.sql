-- 0003: a person's resolution of an indeterminate operation (docs/operations.md, "Settling an
-- indeterminate operation"). The record carries every field; the columns say who settled a
-- receipt and when, readable without decoding records. Old rows get NULL: nobody resolved them.

ALTER TABLE operations ADD COLUMN resolved_by TEXT;

ALTER TABLE operations ADD COLUMN resolved_at REAL;
