ALTER TABLE uploads
    DROP COLUMN source_allowed_content_types,
    DROP COLUMN source_declared_content_type,
    DROP COLUMN source_max_size_bytes;
