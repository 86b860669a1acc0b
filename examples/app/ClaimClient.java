// How a Java application calls redpacket.rp_claim with JDBC (README
// "Calling from an application").  Not part of the CI suite (it has no JDK);
// compiled and run by hand with Debian's libpostgresql-jdbc-java:
//
//   javac ClaimClient.java
//   java -cp /usr/share/java/postgresql.jar:. ClaimClient \
//        'jdbc:postgresql://localhost:23001/app?user=app' 1 erin 1.00
//
// prints the claim's status; a second run with the same user prints duplicate.
import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;

public class ClaimClient {
    // serialization failure, deadlock, lock timeout, statement timeout: retry the transaction
    static final Set<String> RETRYABLE = Set.of("40001", "40P01", "55P03", "57014");

    static String claim(Connection c, long activity, String user, BigDecimal amount) throws Exception {
        c.setAutoCommit(false);
        for (int attempt = 1; ; attempt++) {
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT status, claim_id, amount FROM redpacket.rp_claim(?, ?, ?, NULL)")) {
                ps.setLong(1, activity);
                ps.setString(2, user);
                ps.setBigDecimal(3, amount);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    String status = rs.getString(1);
                    c.commit();
                    return status;
                }
            } catch (SQLException e) {
                c.rollback();
                if (!RETRYABLE.contains(e.getSQLState()) || attempt == 10) throw e;
                Thread.sleep(ThreadLocalRandom.current().nextLong(1, 10L << Math.min(attempt, 6)));
            }
        }
    }

    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0])) {
            System.out.println(claim(c, Long.parseLong(args[1]), args[2], new BigDecimal(args[3])));
        }
    }
}
