-- One round's activities (psql variable :round); prints kind|id.
INSERT INTO stress_activity (id, round, kind, label, descr) VALUES
    (redpacket.rp_create_activity(5000.00, stripes => 16, name => 'stress fixed'),
     :round, 'fixed', :round || '/fixed', 'fixed 0.01-5.00, 3000 users, 16 stripes; rollbacks, batches, pairs'),
    (redpacket.rp_create_activity(5000.00, packets => 2000, stripes => 16, name => 'stress lucky'),
     :round, 'lucky', :round || '/lucky', 'lucky draw, 2000 packets, 4000 users, 16 stripes'),
    (redpacket.rp_create_activity(2500.00, stripes => 1, per_user_limit => 3, name => 'stress rain'),
     :round, 'rain', :round || '/rain', 'per_user_limit 3, request ids r1-r5, 800 users, 1 stripe'),
    (redpacket.rp_create_activity(100.00, stripes => 2, name => 'stress 0.07'),
     :round, 'cent7', :round || '/cent7', '0.07 each from 100.00, 2 stripes')
RETURNING kind, id;
