"""Raw tables fetched by revision and sha256, prepared splits and the feature cache."""
