-- Two usernames that differ only by case cannot both exist. The service
-- refuses to run this when such pairs already exist (see store::migrate).
CREATE UNIQUE INDEX users_username_lower ON users (lower(username));
