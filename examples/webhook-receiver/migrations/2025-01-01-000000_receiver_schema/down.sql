DROP TABLE applied_effects;
DROP TABLE videos;
DROP TABLE seen_events;
