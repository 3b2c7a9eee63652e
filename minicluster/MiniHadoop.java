// A Hadoop cluster in one JVM for trying and testing sparkdl_train on YARN: a MiniDFSCluster (NameNode and
// DataNodes) and a MiniYARNCluster (ResourceManager and NodeManagers), the classes Spark's YarnClusterSuite runs on.
// Started by minicluster/hadoop.py (`./run yarn up`), which fetches the jars, compiles this file and stops the
// JVM by pid. Everything binds to loopback with ports the daemons pick; the client configuration is written
// to <dir>/conf/hadoop (HADOOP_CONF_DIR) once every NodeManager has registered, then "READY" is printed.
//
// Commands arrive as files: <dir>/control/<n>.cmd holds one line; the answer goes to <n>.out, then <n>.done
// appears. They stand in for what an operator or the cluster does to a running application:
//   nodes                        one line per NodeManager: index, node id, state, used and total memory (MB), used and
//                                total GPUs (yarn.io/gpu)
//   stop-nm <i>                  stop NodeManager i (a lost node: its containers are killed with it)
//   node-resource <i> <mb> <vc> [gpus]
//                                set NodeManager i's resources (0 MB: nothing more is granted there; its GPUs stay as
//                                they are unless given)
import java.io.File;
import java.io.FileOutputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.yarn.api.records.NodeId;
import org.apache.hadoop.yarn.api.records.NodeReport;
import org.apache.hadoop.yarn.api.records.NodeState;
import org.apache.hadoop.yarn.api.records.Resource;
import org.apache.hadoop.yarn.api.records.ResourceOption;
import org.apache.hadoop.yarn.client.api.YarnClient;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.api.protocolrecords.UpdateNodeResourceRequest;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;

public class MiniHadoop {
  public static void main(String[] args) {
    try {
      run(args);
    } catch (Throwable t) {  // the daemons' threads would keep a half-started cluster alive: exit instead
      t.printStackTrace();
      System.exit(1);
    }
  }

  private static void run(String[] args) throws Exception {
    Map<String, String> opt = new HashMap<>();
    List<String> sets = new ArrayList<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (args[i].equals("--set")) sets.add(args[i + 1]); else opt.put(args[i], args[i + 1]);
    }
    File dir = new File(opt.get("--dir")).getAbsoluteFile();
    int nodeManagers = Integer.parseInt(opt.getOrDefault("--nodemanagers", "2"));
    int dataNodes = Integer.parseInt(opt.getOrDefault("--datanodes", "1"));

    Configuration conf = new YarnConfiguration();
    conf.set("hadoop.tmp.dir", new File(dir, "tmp").getPath());
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(dir, "dfs").getPath());
    conf.setInt("dfs.replication", 1);
    conf.setBoolean("dfs.permissions.enabled", true);
    // MiniYARNCluster overwrites yarn.nodemanager.resource.memory-mb with its own key's value (default 4096)
    conf.set("yarn.minicluster.yarn.nodemanager.resource.memory-mb", opt.getOrDefault("--nm-memory-mb", "4096"));
    conf.set("yarn.nodemanager.resource.memory-mb", opt.getOrDefault("--nm-memory-mb", "4096"));
    conf.set("yarn.nodemanager.resource.cpu-vcores", opt.getOrDefault("--nm-vcores", "4"));
    conf.set("yarn.scheduler.minimum-allocation-mb", "256");
    conf.set("yarn.scheduler.maximum-allocation-mb", opt.getOrDefault("--nm-memory-mb", "4096"));
    // containers are JVMs and Python workers with TensorFlow: their virtual size says nothing; their resident
    // size is checked (a container over its memory is killed, as on a production NodeManager)
    conf.setBoolean("yarn.nodemanager.vmem-check-enabled", false);
    conf.setBoolean("yarn.nodemanager.pmem-check-enabled", true);
    // MiniYARNCluster turns its NodeManagers' container monitor off unless asked to keep it
    conf.setBoolean("yarn.minicluster.control-resource-monitoring", true);
    // without cgroups the monitor's own check is the only one, and it is skipped while memory.enforced says
    // something else (cgroups) enforces the limits: true by default up to Hadoop 3.5 (YARN-11967)
    conf.setBoolean("yarn.nodemanager.resource.memory.enforced", false);
    conf.set("yarn.nodemanager.container-monitor.interval-ms", "1000");
    // the disk of a shared development machine may be fuller than YARN's 90% default allows
    conf.set("yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage", "99.5");
    conf.set("yarn.nodemanager.delete.debug-delay-sec", "0");
    // a lost NodeManager is noticed in seconds, not YARN's 10 minutes
    conf.set("yarn.nm.liveness-monitor.expiry-interval-ms", "6000");
    conf.set("yarn.resourcemanager.nm.liveness-monitor.interval-ms", "1000");
    conf.set("yarn.resourcemanager.am.max-attempts", "4");
    // one queue with the whole cluster (what a CapacityScheduler without capacity-scheduler.xml lacks)
    conf.set("yarn.scheduler.capacity.root.queues", "default");
    conf.set("yarn.scheduler.capacity.root.default.capacity", "100");
    conf.set("yarn.scheduler.capacity.root.default.maximum-capacity", "100");
    conf.set("yarn.scheduler.capacity.maximum-am-resource-percent", "0.5");
    // GPUs as YARN knows them (resource type yarn.io/gpu, what Spark asks for with spark.executor.resource.gpu.amount),
    // --nm-gpus per NodeManager, counted by the scheduler (the dominant resource calculator weighs every type). No
    // GPU plugin: nothing is isolated, and the executors' discovery script says which device they have
    int gpus = Integer.parseInt(opt.getOrDefault("--nm-gpus", "1"));
    if (gpus > 0) {
      conf.set("yarn.resource-types", "yarn.io/gpu");
      conf.set("yarn.nodemanager.resource-type.yarn.io/gpu", Integer.toString(gpus));
      conf.set("yarn.scheduler.capacity.resource-calculator", "org.apache.hadoop.yarn.util.resource.DominantResourceCalculator");
    }
    conf.setBoolean("yarn.log-aggregation-enable", false);
    for (String kv : sets) {
      int eq = kv.indexOf('=');
      conf.set(kv.substring(0, eq), kv.substring(eq + 1));
    }

    MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf).numDataNodes(dataNodes).format(true).build();
    dfs.waitActive();
    String defaultFs = dfs.getFileSystem().getUri().toString();
    conf.set("fs.defaultFS", defaultFs);
    FileSystem fs = dfs.getFileSystem();
    // what a cluster's administrator sets up: a world-writable /tmp (YARN's staging) and home directories
    fs.mkdirs(new Path("/tmp"));
    fs.setPermission(new Path("/tmp"), new FsPermission((short) 01777));
    fs.mkdirs(new Path("/user/" + System.getProperty("user.name")));
    fs.mkdirs(new Path("/apps"));
    fs.setPermission(new Path("/apps"), new FsPermission((short) 0755));

    // The daemons' local file system sets permissions with a system call (java.nio), where Hadoop without its
    // native library forks `chmod` once per file: a NodeManager localizing ./run pack's archive (17,700 files)
    // spent 70 s of its 80 s in those forks. A production NodeManager has libhadoop and makes the same call.
    conf.set("fs.file.impl", NioLocalFileSystem.class.getName());
    conf.set("fs.AbstractFileSystem.file.impl", NioLocalFs.class.getName());

    MiniYARNCluster yarn = new MiniYARNCluster("yarn", nodeManagers, 1, 1);
    yarn.init(conf);
    yarn.start();
    if (!yarn.waitForNodeManagersToConnect(120_000)) throw new IllegalStateException("NodeManagers did not register");

    Configuration client = new Configuration(yarn.getConfig());
    client.set("fs.defaultFS", defaultFs);
    // MiniDFSCluster's rack mapping is a test class that clients do not have: back to Hadoop's default
    client.unset("net.topology.node.switch.mapping.impl");
    client.unset("fs.file.impl");  // this JVM's classes, not a client's
    client.unset("fs.AbstractFileSystem.file.impl");
    File confDir = new File(dir, "conf/hadoop");
    confDir.mkdirs();
    for (String name : new String[] {"core-site.xml", "yarn-site.xml", "hdfs-site.xml"}) {
      File tmp = new File(confDir, name + ".tmp");
      try (OutputStream out = new FileOutputStream(tmp)) { client.writeXml(out); }
      Files.move(tmp.toPath(), new File(confDir, name).toPath(), java.nio.file.StandardCopyOption.ATOMIC_MOVE);
    }
    YarnClient yc = YarnClient.createYarnClient();
    yc.init(client);
    yc.start();
    System.out.println("fs.defaultFS " + defaultFs);
    System.out.println("yarn.resourcemanager.address " + client.get("yarn.resourcemanager.address"));
    System.out.println("yarn.resourcemanager.webapp.address " + client.get("yarn.resourcemanager.webapp.address"));
    System.out.println("READY");
    System.out.flush();

    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try { yc.stop(); yarn.stop(); } catch (Exception e) { e.printStackTrace(); }
      try { dfs.shutdown(); } catch (Exception e) { e.printStackTrace(); }
    }));

    File control = new File(dir, "control");
    control.mkdirs();
    while (true) {
      File[] cmds = control.listFiles((d, n) -> n.endsWith(".cmd"));
      if (cmds != null) {
        Arrays.sort(cmds);
        for (File cmd : cmds) {
          String stem = cmd.getName().substring(0, cmd.getName().length() - 4);
          String line = new String(Files.readAllBytes(cmd.toPath()), StandardCharsets.UTF_8).trim();
          String answer;
          try {
            answer = command(line.split("\\s+"), yarn, yc);
          } catch (Exception e) {
            answer = "error: " + e;
          }
          Files.write(new File(control, stem + ".out").toPath(), answer.getBytes(StandardCharsets.UTF_8));
          cmd.delete();
          new File(control, stem + ".done").createNewFile();
        }
      }
      Thread.sleep(100);
    }
  }

  private static int nodeManagersOf(MiniYARNCluster yarn) {
    int n = 0;
    while (true) {
      try { if (yarn.getNodeManager(n) == null) return n; } catch (IndexOutOfBoundsException e) { return n; }
      n++;
    }
  }

  private static long gpus(Resource r) {
    if (r == null) return 0;
    try { return r.getResourceValue("yarn.io/gpu"); } catch (Exception e) { return 0; }  // not a declared type
  }

  private static String command(String[] cmd, MiniYARNCluster yarn, YarnClient yc) throws Exception {
    switch (cmd[0]) {
      case "nodes": {
        StringBuilder out = new StringBuilder();
        Map<NodeId, NodeReport> reports = new HashMap<>();
        for (NodeReport r : yc.getNodeReports()) reports.put(r.getNodeId(), r);
        for (int i = 0; i < nodeManagersOf(yarn); i++) {
          NodeManager nm = yarn.getNodeManager(i);
          NodeId id = nm.getNMContext().getNodeId();
          NodeReport r = reports.get(id);
          out.append(i).append(' ').append(id).append(' ')
             .append(nm.getServiceState()).append(' ')
             .append(r == null ? "UNKNOWN" : r.getNodeState()).append(' ')
             .append(r == null || r.getUsed() == null ? 0 : r.getUsed().getMemorySize()).append(' ')
             .append(r == null ? 0 : r.getCapability().getMemorySize()).append(' ')
             .append(gpus(r == null ? null : r.getUsed())).append(' ')
             .append(gpus(r == null ? null : r.getCapability())).append('\n');
        }
        return out.toString();
      }
      case "stop-nm": {
        NodeManager nm = yarn.getNodeManager(Integer.parseInt(cmd[1]));
        String id = nm.getNMContext().getNodeId().toString();
        nm.stop();
        return "stopped " + id;
      }
      case "node-resource": {
        NodeManager nm = yarn.getNodeManager(Integer.parseInt(cmd[1]));
        NodeId id = nm.getNMContext().getNodeId();
        Resource resource = Resource.newInstance(Long.parseLong(cmd[2]), Integer.parseInt(cmd[3]));
        long gpus = cmd.length > 4 ? Long.parseLong(cmd[4])
            : gpus(yarn.getResourceManager().getRMContext().getRMNodes().get(id).getTotalCapability());
        try { resource.setResourceValue("yarn.io/gpu", gpus); } catch (Exception e) { /* not a declared type */ }
        Map<NodeId, ResourceOption> change = new HashMap<>();
        change.put(id, ResourceOption.newInstance(resource, -1));
        yarn.getResourceManager().getRMContext().getRMAdminService().updateNodeResource(UpdateNodeResourceRequest.newInstance(change));
        return "resource " + id + " " + resource;
      }
      default:
        return "error: unknown command " + cmd[0];
    }
  }

  /** The local file system with permissions set by java.nio instead of a forked chmod per file. */
  public static class NioRawLocalFileSystem extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      if (permission.getStickyBit()) {  // java.nio has no sticky bit: Hadoop's own way for the rare directory that has one
        super.setPermission(p, permission);
        return;
      }
      Set<PosixFilePermission> perms = EnumSet.noneOf(PosixFilePermission.class);
      add(perms, permission.getUserAction(), PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE);
      add(perms, permission.getGroupAction(), PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE);
      add(perms, permission.getOtherAction(), PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);
      Files.setPosixFilePermissions(pathToFile(p).toPath(), perms);
    }

    private static void add(Set<PosixFilePermission> perms, FsAction a, PosixFilePermission r, PosixFilePermission w, PosixFilePermission x) {
      if (a.implies(FsAction.READ)) perms.add(r);
      if (a.implies(FsAction.WRITE)) perms.add(w);
      if (a.implies(FsAction.EXECUTE)) perms.add(x);
    }
  }

  /** fs.file.impl: LocalFileSystem (checksums) over {@link NioRawLocalFileSystem}. */
  public static class NioLocalFileSystem extends LocalFileSystem {
    public NioLocalFileSystem() {
      super(new NioRawLocalFileSystem());
    }
  }

  /** fs.AbstractFileSystem.file.impl (FileContext, what the NodeManager's localizer uses) over {@link NioLocalFileSystem}. */
  public static class NioLocalFs extends DelegateToFileSystem {
    public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new NioLocalFileSystem(), conf, "file", false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;
    }
  }
}
